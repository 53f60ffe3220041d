"""`wattlab live RUN`: a live panel of a run file while the recorder writes it."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from wattlab.acquisition.session import follow, plain_table
from wattlab.arg_types import seconds
from wattlab.errors import UsageError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "live", help="show a live panel of a run file being recorded",
        description="Follow a run file (also from another terminal while `wattlab record` "
                    "writes it): per source the current power, rate, samples, drops, energy "
                    "so far and a sparkline. Exits when the recorder closes the file, or on "
                    "Ctrl-C. When stdout is not a terminal only the final status is printed.")
    p.add_argument("run", help="run file (may not exist yet: it is waited for)")
    p.add_argument("--interval", type=seconds(3600), default=0.5, metavar="S",
                   help="seconds between updates (default 0.5)")
    p.add_argument("--wait", type=seconds(zero=True), default=30.0, metavar="S",
                   help="how long to wait for the file to appear (default 30 s)")
    return p


def refuse_what_cannot_become_a_run(path: str) -> None:
    """A path that exists but will never be a run file is refused now, not after --wait.

    An empty file may be a recorder's file being created, and a file open for writing is
    checked by the panel as it grows; a closed file gets every check a reader makes.
    """
    from wattlab.runfile import HDF5_SIGNATURE, Run, writer_status

    if os.path.isdir(path):
        raise UsageError(f"{path}: is a folder, not a run file")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise UsageError(f"{path}: the folder {folder} does not exist, so no recorder can "
                         "create the run file there")
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb") as f:
        if f.read(len(HDF5_SIGNATURE)) != HDF5_SIGNATURE:
            raise UsageError(f"{path}: not a run file (not an HDF5 file)")
    if not writer_status(path).open:
        Run(path).close()


def say_what_is_awaited(path: str, wait_s: float) -> None:
    """A file not there yet (or still empty) is waited for: say so at once, not after."""
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        return
    print(f"wattlab live: waiting up to {wait_s:g} s for {path} to be written by `wattlab "
          f"record -o {path} ...` (--wait S to change)", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    refuse_what_cannot_become_a_run(args.run)
    say_what_is_awaited(args.run, args.wait)
    from rich.console import Console

    console = Console()
    statuses = follow(args.run, console=console, interval_s=args.interval, wait_s=args.wait)
    if not console.is_terminal:
        print(plain_table(statuses))
    return 0
