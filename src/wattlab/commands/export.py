"""`wattlab export RUN… -o TABLE.parquet|.csv`: one tidy table of many runs' energies.

``--by-request``: one row per request instead (``wattlab energy --by-request``'s figures);
``--by-process``: one row per process on each GPU (``wattlab energy --by-process``'s).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from wattlab.analysis.many_runs import add_runs_arguments, expand_runs, map_runs, report_errors
from wattlab.arg_types import OutputFile
from wattlab.errors import UsageError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "export", help="a tidy table (CSV or Parquet) of many runs' energy per stream and phase",
        description="One row per run, stream channel and phase (the whole run, then each "
                    "marked phase), with the figures of `wattlab energy --by-marker`. "
                    "pandas, polars and DuckDB read the file directly.")
    add_runs_arguments(p)
    p.add_argument("-o", "--output", required=True, metavar="TABLE", type=OutputFile("table"),
                   help="the table to write (.csv or .parquet); never overwritten")
    p.add_argument("--format", choices=("csv", "parquet"),
                   help="default: from the output's suffix; parquet needs pyarrow")
    p.add_argument("--by-request", action="store_true",
                   help="one row per request of each run (docs/serving.md) instead")
    p.add_argument("--by-process", action="store_true",
                   help="one row per process on each GPU of each run, activity rule, "
                        "shared parts as their own (docs/process-energy.md) instead")
    return p


def run(args: argparse.Namespace) -> int:
    from wattlab.analysis.report import TableWriter, format_of, tidy_rows

    rows_of, columns = tidy_rows, None
    if args.by_request and args.by_process:
        raise UsageError("give one of --by-request and --by-process")
    if args.by_process:
        from wattlab.analysis.attribution import PROCESS_COLUMNS, process_rows

        rows_of, columns = process_rows, PROCESS_COLUMNS
    if args.by_request:
        from wattlab.analysis.attribution import REQUEST_COLUMNS, request_rows

        rows_of, columns = request_rows, REQUEST_COLUMNS
    fmt = format_of(args.output, args.format)
    paths = expand_runs(args.runs)
    writer = TableWriter(args.output, fmt, columns)
    outcomes = []
    try:
        for outcome in map_runs(rows_of, paths, args.jobs):
            outcomes.append(outcome)
            if not outcome.error:
                writer.write(outcome.result)
                outcome.result = None  # written: keep only whether it failed
    except BaseException:
        _discard(writer, args.output)
        raise
    failed = sum(bool(o.error) for o in outcomes)
    if failed:  # a table without some runs reads as whole: none is better
        _discard(writer, args.output)
        print(f"{args.output}: not written: {failed} of {len(paths)} run file(s) failed")
    else:
        writer.close()
        print(f"{args.output}: {writer.rows} rows from {len(paths)} run file(s)")
    return report_errors(outcomes)


def _discard(writer: Any, output: str) -> None:
    """Close and delete a table the export could not finish."""
    try:
        writer.close()
    finally:
        os.remove(output)
