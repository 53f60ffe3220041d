"""Meter kinds that describe themselves: one registration instead of edits in five files.

A meter's source module ends with ``register(MeterKind(...))``: how to build its
acquirer, its ``--meter`` name and aliases, its bench-file options and rails, the USB ids
and the identify query ``wattlab devices`` may use, and its emulator for ``wattlab
emulate``. ``--meter``, bench files, ``devices`` and ``emulate`` all ask this registry, so
adding a meter is: a driver, an emulator, a source module that registers itself, its
tests, and the module's name in ``METER_MODULES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from wattlab.option_checks import Check

METER_MODULES = (  # in the order meters are listed (bench template, error messages)
    "wattlab.acquisition.acquirers.powersensor3_acquirer",
    "wattlab.acquisition.acquirers.pmd_acquirer",
    "wattlab.acquisition.acquirers.scpi_acquirers",
    "wattlab.acquisition.acquirers.mcp39f511_acquirer",
    "wattlab.acquisition.acquirers.rapl_acquirer",
    "wattlab.acquisition.acquirers.amd_acquirer",
)


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
    """

    kind: str
    default_id: str
    help: str
    build: Builder
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
    """Called by a meter module as it is imported; a second kind of one name is an error."""
    known = _KINDS.get(kind.kind)
    if known is not None and known is not kind:
        raise ValueError(f"meter kind {kind.kind!r} registered twice")
    _KINDS[kind.kind] = kind
    return kind


def meter_kinds() -> dict[str, MeterKind]:
    """Every registered kind, importing the meter modules on first use.

    In ``METER_MODULES`` order, whichever module a program happened to import first.
    """
    for module in METER_MODULES:
        importlib.import_module(module)  # once: later calls find it in sys.modules

    def place(kind: MeterKind) -> int:
        module = kind.build.__module__
        return METER_MODULES.index(module) if module in METER_MODULES else len(METER_MODULES)

    return {k.kind: k for k in sorted(_KINDS.values(), key=place)}
