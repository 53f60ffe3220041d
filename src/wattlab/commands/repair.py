"""`wattlab repair RUN [--force] [--json]`: a crash-left run file, readable by any HDF5 tool.

The work is ``runfile/repair.py``'s; a cleanly closed file is left as it is.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from wattlab.arg_types import InputFile
from wattlab.runfile import repair_run


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "repair", help="close a run file its recorder died with, so any HDF5 tool opens it",
        description="Clear the 'open for writing' marks a killed recorder left, check every "
                    "dataset against /progress, trim rows a crash left torn (never a whole "
                    "one) and record what was done in the file's repair_json attribute. "
                    "Refuses while the recorder that writes the file still runs.")
    p.add_argument("run", type=InputFile("run file"), help="run file")
    p.add_argument("--force", action="store_true",
                   help="repair although it cannot be checked whether the recorder still runs "
                        "(the file comes from another host or an older wattlab)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def run(args: argparse.Namespace) -> int:
    report = repair_run(args.run, force=args.force)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    if not report.repaired:
        print(f"{args.run}: closed cleanly; nothing to repair")
        return 0
    kept = sum(s["rows_kept"] for s in report.sources.values())
    print(f"{args.run}: repaired (consistency flags 0x{report.crash_flags:x} cleared); "
          f"{kept} rows kept in {len(report.sources)} source(s), "
          f"{report.rows_trimmed} torn row(s) trimmed")
    for source_id, record in report.sources.items():
        if record["rows_trimmed"] or record["rows_unconfirmed_kept"]:
            print(f"  {source_id}: {record['rows_trimmed']} trimmed, "
                  f"{record['rows_unconfirmed_kept']} kept after the last progress record")
    for source_id in report.sources_unreadable:
        print(f"  {source_id}: its group was not whole on disk; removed, every row of it lost")
    for name, count in report.tables_trimmed.items():
        if count:
            print(f"  /{name}: {count} blank row(s) trimmed")
    if report.gaps_added:
        print(f"  gap 'recording cut off' added for {', '.join(report.gaps_added)}")
    print("any HDF5 tool (h5py, pandas, HDFView, h5dump) opens it now")
    return 0
