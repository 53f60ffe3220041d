"""`wattlab import FORMAT FILE… -o RUN`: other tools' power logs as a wattlab run."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from wattlab.arg_types import InputFile, OutputFile
from wattlab.errors import UsageError
from wattlab.importers import READERS, import_files, read_hmc8015_log

FORMATS = {**READERS, "hmc8015-log": read_hmc8015_log}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "import",
        help="import power logs (csv, nvidia-smi, pmt, nvml-npz, hmc8015-log) into a run file")
    p.add_argument("format", choices=sorted(FORMATS), help="input format")
    p.add_argument("files", nargs="+", type=InputFile("input file"),
                   help="input files; each becomes a source")
    p.add_argument("-o", "--output", required=True, type=OutputFile("run file"),
                   help="run file to create")
    p.add_argument("--source", action="append", metavar="NAME",
                   help="source name for each file, in order (default: the file stem)")
    p.add_argument("--time-column", help="csv: the time column (default: the first)")
    p.add_argument("--time-unit", default="s", help="csv: s, ms, us or ns (default s)")
    p.add_argument("--unit", action="append", default=[], metavar="COLUMN=UNIT",
                   help="csv: unit of a column without a _w / [W] suffix")
    return p


def run(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.format == "csv":
        units = {}
        for item in args.unit:
            col, sep, unit = item.rpartition("=")
            if not sep or not col or not unit:
                raise UsageError(f"--unit {item!r}: expected COLUMN=UNIT")
            units[col] = unit
        options = {"time_column": args.time_column, "time_unit": args.time_unit,
                   "units": units}
    elif args.unit or args.time_column:
        raise UsageError("--unit and --time-column apply to the csv format only")
    ids = import_files(args.format, args.files, args.output, args.source,
                       command=["wattlab", *sys.argv[1:]], readers=FORMATS, **options)
    print(f"{args.output}: {len(ids)} source(s): {', '.join(ids)}")
    print(f"next: wattlab info {args.output}")
    return 0
