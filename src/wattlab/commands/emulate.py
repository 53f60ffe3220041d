"""`wattlab emulate KIND`: run one emulated instrument on its own, to point a driver at."""

from __future__ import annotations

import argparse
from typing import Any

from wattlab.acquisition.acquirers import MeterKind, meter_kinds
from wattlab.arg_types import SEED
from wattlab.errors import UsageError


def emulated_kinds() -> dict[str, MeterKind]:
    """Every name ``emulate`` accepts, with the meter kind whose emulator runs it."""
    return {name: k for k in meter_kinds().values() if k.emulate is not None
            for name in k.emulate_as}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "emulate", help="run an emulated meter (pty or TCP) measuring a simulated GPU",
        description="Serial meters print the pseudo-terminal to open; SCPI analysers print the "
                    "VISA resource string. Readings follow a simulated GPU's true power under a "
                    "repeating demo workload. Stop with Ctrl-C or SIGTERM (exit 130); what the "
                    "emulator wrote in the temporary folder is removed.")
    p.add_argument("kind", help=f"one of {', '.join(emulated_kinds())}")
    p.add_argument("--seed", type=SEED, default=11, help="seed of the simulated workload")
    return p


def run(args: argparse.Namespace) -> int:
    from wattlab.hardware.emulators.emulator_run import run_until_stopped
    from wattlab.hardware.virtual_bench import looping_gpu

    name = args.kind.lower()
    kind = emulated_kinds().get(name)
    if kind is None or kind.emulate is None:
        raise UsageError(f"unknown instrument {args.kind!r}; choose one of "
                         f"{', '.join(emulated_kinds())}")
    emulate = kind.emulate
    return run_until_stopped(
        lambda: emulate(looping_gpu(args.seed).true_power_w, args.seed, name))
