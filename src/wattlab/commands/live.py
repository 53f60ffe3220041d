"""`wattlab live RUN`: a live panel of a run file while the recorder writes it."""

from __future__ import annotations

import argparse
from typing import Any

from wattlab.acquisition.session import follow, plain_table
from wattlab.errors import UsageError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "live", help="show a live panel of a run file being recorded",
        description="Follow a run file (also from another terminal while `wattlab record` "
                    "writes it): per source the current power, rate, samples, drops, energy "
                    "so far and a sparkline. Exits when the recorder closes the file, or on "
                    "Ctrl-C. When stdout is not a terminal only the final status is printed.")
    p.add_argument("run", help="run file (may not exist yet: it is waited for)")
    p.add_argument("--interval", type=float, default=0.5, metavar="S",
                   help="seconds between updates (default 0.5)")
    p.add_argument("--wait", type=float, default=30.0, metavar="S",
                   help="how long to wait for the file to appear (default 30 s)")
    return p


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0 s, got {args.interval}")
    from rich.console import Console

    console = Console()
    statuses = follow(args.run, console=console, interval_s=args.interval, wait_s=args.wait)
    if not console.is_terminal:
        print(plain_table(statuses))
    return 0
