"""`wattlab emulate KIND`: run one emulated instrument on its own, to point a driver at."""

from __future__ import annotations

import argparse
from typing import Any

from wattlab.acquisition.meter_registry import meter_kinds
from wattlab.errors import UsageError

SERIAL_KINDS = ("powersensor3", "pmd")
VISA_KINDS = ("wt310e", "wt332e", "wt333e", "hmc8015")


def emulated_kinds() -> tuple[str, ...]:
    """Every instrument ``emulate`` can run, registered meters with an emulator included."""
    return SERIAL_KINDS + VISA_KINDS + tuple(
        k.kind for k in meter_kinds().values() if k.emulate is not None)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "emulate", help="run an emulated meter (pty or TCP) measuring a simulated GPU",
        description="Serial meters print the pseudo-terminal to open; SCPI analysers print the "
                    "VISA resource string. Readings follow a simulated GPU's true power under a "
                    "repeating demo workload. Stop with Ctrl-C.")
    p.add_argument("kind", help=f"one of {', '.join(emulated_kinds())}")
    p.add_argument("--seed", type=int, default=11, help="seed of the simulated workload")
    return p


def run(args: argparse.Namespace) -> int:
    from wattlab.hardware.virtual_bench import looping_gpu

    kind = args.kind.lower()
    power_w = looping_gpu(args.seed).true_power_w
    registered = meter_kinds().get(kind)
    if registered is not None and registered.emulate is not None:
        return registered.emulate(power_w, args.seed)
    if kind == "powersensor3":
        from wattlab.hardware.powersensor3_emulator import run_emulator_cli

        return run_emulator_cli(power_w, seed=args.seed)
    if kind == "pmd":
        from wattlab.hardware import pmd_emulator

        return pmd_emulator.run_emulator_cli(power_w)
    if kind in VISA_KINDS:
        from wattlab.hardware.scpi_server import run_emulator_cli as run_scpi

        return run_scpi(kind, power_w)
    raise UsageError(f"unknown instrument {args.kind!r}; choose one of "
                     f"{', '.join(emulated_kinds())}")
