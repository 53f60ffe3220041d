"""`wattlab import FORMAT FILE… -o RUN`: other tools' power logs as a wattlab run.

`wattlab import requests LOG --into RUN` adds a per-request log to an existing run
(docs/serving.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from wattlab.arg_types import InputFile, OutputFile
from wattlab.errors import UsageError
from wattlab.importers import READERS, import_files, read_hmc8015_log

FORMATS = {**READERS, "hmc8015-log": read_hmc8015_log}
REQUESTS = "requests"  # not a power log: a table added to a run (--into)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "import",
        help="import power logs (csv, nvidia-smi, pmt, nvml-npz, hmc8015-log) into a run file, "
             "or a per-request log into an existing one (requests … --into RUN)")
    p.add_argument("format", choices=sorted([*FORMATS, REQUESTS]), help="input format")
    p.add_argument("files", nargs="+", type=InputFile("input file"),
                   help="input files; each becomes a source")
    p.add_argument("-o", "--output", type=OutputFile("run file"),
                   help="run file to create (every format but requests)")
    p.add_argument("--into", type=InputFile("run file"), metavar="RUN",
                   help="requests: the run file the request log is added to")
    p.add_argument("--source", action="append", metavar="NAME",
                   help="source name for each file, in order (default: the file stem)")
    p.add_argument("--time-column", help="csv: the time column (default: the first)")
    p.add_argument("--time-unit", default="s", help="csv: s, ms, us or ns (default s)")
    p.add_argument("--unit", action="append", default=[], metavar="COLUMN=UNIT",
                   help="csv: unit of a column without a _w / [W] suffix")
    return p


def run(args: argparse.Namespace) -> int:
    if args.format == REQUESTS:
        return import_requests(args)
    if args.output is None or args.into is not None:
        raise UsageError("--into is for `import requests`; a power log needs -o RUN (new)")
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


def import_requests(args: argparse.Namespace) -> int:
    """Check a request log against the run and store it at /analysis/requests."""
    from wattlab.analysis.attribution import parse_request_log, write_requests
    from wattlab.runfile import SESSION_START_UNIX_NS, Run

    if args.into is None or args.output is not None or len(args.files) != 1:
        raise UsageError("import requests takes one LOG and --into RUN (an existing run file)")
    if args.source or args.unit or args.time_column:
        raise UsageError("--source, --unit and --time-column are for power logs")
    log_path = args.files[0]
    with Run(args.into) as run_file:
        if SESSION_START_UNIX_NS not in run_file.attrs:
            raise UsageError(f"{args.into}: no {SESSION_START_UNIX_NS} attribute: its wall-clock "
                             "start is unknown, so a log's times cannot be placed in it")
        start_ns = int(run_file.attrs[SESSION_START_UNIX_NS])
        ends = [float(v.time_s[-1]) for v in run_file.sources.values() if len(v)]
        starts = [float(v.time_s[0]) for v in run_file.sources.values() if len(v)]
    if not ends:
        raise UsageError(f"{args.into}: no samples: no span to place requests in")
    try:
        with open(log_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{log_path}: cannot read the request log ({e})") from e
    log = parse_request_log(log_path, lines, start_ns, (min(0.0, *starts), max(ends)))
    where = write_requests(args.into, log_path, log)
    skipped = f", {log.skipped} failed request(s) left out" if log.skipped else ""
    print(f"{args.into}: {len(log.requests)} request(s) from {log_path} ({log.format} format"
          f"{skipped}) at {where}")
    print(f"next: wattlab energy {args.into} --by-request")
    return 0
