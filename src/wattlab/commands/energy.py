"""`wattlab energy RUN [--by-marker] [--window T0:T1] [--json]`: joules per phase.

``--calibration cal.json`` corrects NVML energy with a record from `wattlab calibrate`.
"""

from __future__ import annotations

import argparse
import json
import math
from functools import partial
from typing import Any

from wattlab.analysis.many_runs import add_runs_arguments, expand_runs, map_runs, report_errors


def window_s(text: str) -> tuple[float, float]:
    """'T0:T1' as two finite seconds."""
    start, sep, end = text.partition(":")
    try:
        t0_s, t1_s = float(start), float(end)
    except ValueError:
        t0_s = t1_s = math.nan
    if not sep or not (math.isfinite(t0_s) and math.isfinite(t1_s)):
        raise argparse.ArgumentTypeError(f"{text!r} is not START:END in seconds, e.g. 12.5:40")
    return t0_s, t1_s  # the order is energy_report's to check, for the API too


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "energy", help="energy and mean power per source and phase, with intervals")
    add_runs_arguments(p)
    p.add_argument("--by-marker", action="store_true",
                   help="also one row per phase (begin/end markers)")
    p.add_argument("--window", action="append", default=[], type=window_s, metavar="T0:T1",
                   help="also one row for this span, seconds since the session start "
                        "(repeatable)")
    p.add_argument("--reference", metavar="SRC[:CHANNEL]",
                   help="stream the errors are relative to (default: the first non-NVML meter)")
    p.add_argument("--calibration", metavar="CAL.json",
                   help="correct NVML energy with a record from `wattlab calibrate -o`")
    p.add_argument("--force-calibration", action="store_true",
                   help="apply a calibration record even if its data could not pin the kernel")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def report_of(path: str, options: dict[str, Any]) -> dict[str, Any]:
    """One file's energy report (a worker's job when there are several files)."""
    # imported here: every verb's module is imported to build the parser, and its
    # dependencies (scipy) would otherwise cost every `wattlab` command their start-up time
    from wattlab.analysis.energy import energy_report
    from wattlab.analysis.run_file import Run

    with Run(path) as run_file:
        return energy_report(run_file, **options)


def run(args: argparse.Namespace) -> int:
    from wattlab.analysis.energy import format_report

    record = None
    if args.calibration:
        from wattlab.analysis.calibration import load_record

        record = load_record(args.calibration, force=args.force_calibration)
    options = {"by_marker": args.by_marker, "reference": args.reference,
               "calibration": record, "windows": args.window}
    paths = expand_runs(args.runs)
    if len(paths) == 1:
        report = report_of(paths[0], options)
        print(json.dumps(report, indent=2) if args.json else format_report(report))
        return 0
    outcomes = []
    for outcome in map_runs(partial(report_of, options=options), paths, args.jobs):
        outcomes.append(outcome)
        if outcome.error or args.json:
            continue
        print(f"== {outcome.path}")
        print(format_report(outcome.result))
    if args.json:
        print(json.dumps([o.result for o in outcomes if not o.error], indent=2))
    return report_errors(outcomes)
