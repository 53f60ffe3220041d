"""Meter kinds that describe themselves: one registration instead of edits in five files.

A meter's acquirer module ends with ``register(MeterKind(...))``: how to build its
acquirer, its ``--meter`` name and aliases, what its stream writes to disk, its bench-file
options and rails, the USB ids and the identify query ``wattlab devices`` may use, and its
emulator for ``wattlab emulate``. ``--meter``, bench files, ``devices``, ``emulate`` and the
disk budget all ask this registry, so adding a meter is: a driver, an emulator, an acquirer
module that registers itself, and one line naming that module: in ``METER_MODULES`` for a
meter shipped with wattlab, or as an entry point of the ``wattlab.meters`` group in the
meter's own package (docs/meters.md, "Adding a meter").
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from wattlab.option_checks import Check

METER_MODULES = (  # in the order meters are listed (bench template, error messages)
    "wattlab.acquisition.acquirers.powersensor3_acquirer",
    "wattlab.acquisition.acquirers.pmd_acquirer",
    "wattlab.acquisition.acquirers.scpi_acquirers",
    "wattlab.acquisition.acquirers.mcp39f511_acquirer",
    "wattlab.acquisition.acquirers.rapl_acquirer",
    "wattlab.acquisition.acquirers.amd_acquirer",
    "wattlab.acquisition.acquirers.scrape.scrape_acquirer",
)
PLUGIN_GROUP = "wattlab.meters"  # entry points naming a module that registers its kinds
NOT_PLUGIN_FOLDERS = tuple(f"{folder}{os.sep}" for folder in  # importlib's, wattlab's
                           (Path(importlib.__file__).parent, Path(__file__).parents[2]))


@dataclass(frozen=True)
class StreamRate:
    """What one stream writes: rows per second of so many bytes (all its datasets).

    Measured on a run file; the disk budget adds them up before a run starts.
    """

    rows_per_s: float
    row_bytes: int


@dataclass(frozen=True)
class Rail:
    """One named input of a meter: which device channels become ``<name>_...``."""

    name: str
    input: str  # what the device calls it: "pair 0", "pcie1", "element 1", "input"
    renames: tuple[tuple[str, str], ...]  # (device channel, channel in the run file)
    power_channel: str | None  # the device channel holding this rail's power, if measured


Builder = Callable[[str, str, Mapping[str, Any]], Any]  # (address, source id, options)
RailsOf = Callable[[Mapping[str, Any]], list[Rail]]  # a bench entry's options → its rails
BoardProblem = Callable[[Mapping[str, Any]], str | None]  # what ``gpu = N`` still needs
Identify = Callable[[Any], str]  # a ByteTransport → identity, or raise MeterError
Emulate = Callable[[Callable[[Any], Any], int, str], int]  # (power_w, seed, name) → status


def no_rails(options: Mapping[str, Any]) -> list[Rail]:
    return []


def input_rails(label: Callable[[str], str],
                renames: Callable[[str], tuple[tuple[str, str], ...]],
                power: Callable[[str], str]) -> RailsOf:
    """Rails of a meter with fixed inputs, named in ``rails = { INPUT = "name" }``.

    ``renames(input)`` gives (device channel, suffix) pairs: the rail's channels are
    ``<name>_<suffix>``; ``power(input)`` is the device channel of that input's power.
    """

    def rails_of(options: Mapping[str, Any]) -> list[Rail]:
        named: dict[str, str] = dict(options.get("rails") or {})
        return [Rail(name, label(key), tuple((old, f"{name}_{suffix}")
                                             for old, suffix in renames(key)), power(key))
                for key, name in named.items()]

    return rails_of


def needs_rails(first_input: str) -> BoardProblem:
    """``gpu = N`` on a meter with fixed inputs needs ``rails`` naming what feeds the GPU."""

    def problem(options: Mapping[str, Any]) -> str | None:
        if "rails" in options:
            return None
        return f'needs rails = {{ {first_input} = "slot_12v", ... }} naming what feeds the GPU'

    return problem


@dataclass(frozen=True)
class MeterKind:
    """Everything wattlab needs to know about one kind of meter, in one place.

    ``options`` are the bench-file keys beyond kind, id, the address (``address_key``), gpu
    and note, with their checks and defaults; ``build`` gets them, defaults filled in, from
    ``--meter`` too. ``rails_of`` turns a bench entry's options into named rails and
    ``board_problem`` says what ``gpu = N`` still needs. ``emulate_as`` are the names
    ``wattlab emulate`` accepts; ``template`` is the commented bench-template section.
    ``stream_rate`` is what its stream writes (None: not measured, and the disk budget
    counts only the stream's first chunks).
    """

    kind: str
    default_id: str
    help: str
    build: Builder
    stream_rate: StreamRate | None
    aliases: tuple[str, ...] = ()
    address_key: str = "port"
    options: Mapping[str, tuple[Check, Any]] = field(default_factory=dict)
    rails_of: RailsOf = no_rails
    board_problem: BoardProblem | None = None
    usb_ids: tuple[tuple[int, int], ...] = ()
    identify: Identify | None = None
    emulate: Emulate | None = None
    emulate_as: tuple[str, ...] = ()
    template: str = ""

    def defaults(self) -> dict[str, Any]:
        return {k: default for k, (_, default) in self.options.items() if default is not None}


_KINDS: dict[str, MeterKind] = {}


def register(kind: MeterKind) -> MeterKind:
    """Called by a meter module as it is imported; a kind or alias already taken is an error.

    Why aliases too: a meter must never silently take over another's ``--meter`` name.
    """
    if _KINDS.get(kind.kind) is kind:
        return kind  # a module imported again registers the same object again
    names = {kind.kind, *kind.aliases}
    for known in _KINDS.values():
        taken = sorted(names & {known.kind, *known.aliases})
        if taken:
            raise ValueError(f"meter kind {kind.kind!r}: {', '.join(map(repr, taken))} is "
                             f"taken by meter kind {known.kind!r} ({known.build.__module__})")
    _KINDS[kind.kind] = kind
    return kind


def meter_kinds() -> dict[str, MeterKind]:
    """Every registered kind: the built-in meters, then the plugins' (loaded on first use).

    In ``METER_MODULES`` order, whichever module a program happened to import first; the
    plugins' kinds follow in the order their entry points were found.
    """
    for module in METER_MODULES:
        importlib.import_module(module)  # once: later calls find it in sys.modules
    load_plugins()

    def place(kind: MeterKind) -> int:
        module = kind.build.__module__
        return METER_MODULES.index(module) if module in METER_MODULES else len(METER_MODULES)

    return {k.kind: k for k in sorted(_KINDS.values(), key=place)}


@cache
def load_plugins() -> None:
    """Import every ``wattlab.meters`` entry point, once; a plugin that fails is a warning.

    Why a failure is a warning and not an error: an installed plugin that is broken, or
    that takes a name already taken, must not stop the built-in meters (nor the other
    plugins) from working. Whatever it registered before failing is taken back, and the
    warning names the entry point and its distribution, so ``--meter``, bench files,
    ``devices`` and ``emulate`` then behave as if it were not installed, after saying why.
    """
    for entry in entry_points(group=PLUGIN_GROUP):
        before = dict(_KINDS)
        try:
            entry.load()
        except Exception as e:  # a plugin's own bug: its kinds are left out, nothing else
            _KINDS.clear()
            _KINDS.update(before)
            print(f"wattlab: warning: meter plugin {plugin_name(entry)} was not loaded: "
                  f"{type(e).__name__}: {e}{where(e)}", file=sys.stderr)


def plugin_name(entry: EntryPoint) -> str:
    """``'toy = toy_meter.toy_acquirer' (wattlab.meters entry point of toy-meter 0.1)``."""
    dist = f"{entry.dist.name} {entry.dist.version}" if entry.dist else "an unknown package"
    return f"'{entry.name} = {entry.value}' ({PLUGIN_GROUP} entry point of {dist})"


def where(error: Exception) -> str:
    """`` at FILE:LINE``: the plugin's line that raised, past importlib's and wattlab's frames.

    Why past wattlab's: for a name already taken ``register`` raises, and the line to fix is
    the plugin's call to it.
    """
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith(("<frozen ", *NOT_PLUGIN_FOLDERS))]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
