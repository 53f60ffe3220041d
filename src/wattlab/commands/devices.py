"""`wattlab devices [--probe PORT] [--json]`: what meters and GPUs this machine has."""

from __future__ import annotations

import argparse
import json
from typing import Any

from wattlab.acquisition.meters import discover


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "devices", help="list serial ports (recognising known meters), VISA resources, GPUs")
    p.add_argument("--probe", action="append", default=[], metavar="PORT",
                   help="also identify this serial port (e.g. an emulator's /dev/pts/N)")
    p.add_argument("--network", action="store_true",
                   help="also discover VXI-11 / HiSLIP instruments (broadcasts on the LAN)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def run(args: argparse.Namespace) -> int:
    found = discover(args.probe, args.network)
    if args.json:
        print(json.dumps([d.to_json() for d in found], indent=2))
        return 0
    for d in found:
        line = f"{d.kind:<13} {d.address:<32} {d.identity or d.description}"
        if d.meter_spec:
            line += f"   use: {d.meter_spec}"
        print(line.rstrip())
        for note in d.notes:
            print(f"{'':<14}{note}")
    return 0
