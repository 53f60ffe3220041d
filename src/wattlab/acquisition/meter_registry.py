"""Meter kinds that describe themselves: one registration instead of edits in five files.

A meter module ends with ``register(MeterKind(...))``: how to build its acquirer, its
``--meter`` name and aliases, its bench-file options and rails, the USB ids and the
identify query ``wattlab devices`` may use, and its emulator for ``wattlab emulate``.
``--meter``, bench files, ``devices`` and ``emulate`` all ask this registry, so adding a
meter is: a driver, an emulator, a source module that registers itself, a test, and its
module name in ``METER_MODULES``. (The four meters written before it are still wired in
by hand in those places.)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from wattlab.option_checks import Check

METER_MODULES = ("wattlab.acquisition.mcp39f511_source",)

Builder = Callable[[str, str, Mapping[str, Any]], Any]  # (address, source id, options)
Identify = Callable[[Any], str]  # a ByteTransport → identity, or raise MeterError
Emulate = Callable[[Callable[[Any], Any], int], int]  # (power_w(t_ns), seed) → exit code


@dataclass(frozen=True)
class MeterKind:
    """Everything wattlab needs to know about one kind of meter, in one place.

    ``rails`` maps each input a bench file may name (``rails = { 1 = "outlet_a" }``) to its
    (device channel, channel suffix) pairs; ``rail_power`` names each input's power channel.
    ``options`` are the bench-file keys beyond id, the address, rails, gpu and note, with
    their checks and defaults; ``build`` gets them (defaults filled) with ``--meter`` too.
    """

    kind: str
    default_id: str
    help: str
    build: Builder
    aliases: tuple[str, ...] = ()
    address_key: str = "port"
    options: Mapping[str, tuple[Check, Any]] = field(default_factory=dict)
    rails: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    rail_power: Mapping[str, str] = field(default_factory=dict)
    usb_ids: tuple[tuple[int, int], ...] = ()
    identify: Identify | None = None
    emulate: Emulate | None = None
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
    """Every registered kind, importing the meter modules on first use."""
    for module in METER_MODULES:
        importlib.import_module(module)  # once: later calls find it in sys.modules
    return dict(_KINDS)
