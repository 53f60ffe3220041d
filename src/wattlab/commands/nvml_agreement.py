"""`wattlab nvml-agreement RUN`: each NVML power view against the energy counter."""

from __future__ import annotations

import argparse
import json
from typing import Any

from wattlab.analysis.nvml_agreement import view_agreement
from wattlab.arg_types import InputFile
from wattlab.runfile import Run


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "nvml-agreement",
        help="how far NVML's 50 Hz buffer, instant and 1 s average are from its energy "
             "counter at 0.1 s, 1 s and 10 s (a run recorded with --nvml-intervals energy=0.1)")
    p.add_argument("run", type=InputFile("run file"), help="run file")
    p.add_argument("--device", default="gpu0", help="the GPU's stream prefix (default gpu0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def run(args: argparse.Namespace) -> int:
    with Run(args.run) as run_file:
        rows = view_agreement(run_file, args.device)
        model = run_file.source(f"{args.device}.energy").model
    if args.json:
        print(json.dumps({"run": args.run, "model": model,
                          "rows": [r.to_json() for r in rows]}, indent=2))
        return 0
    print(f"{args.run}: {model}, each view's energy against the energy counter over whole "
          "windows between counter updates (agreement with the driver, not accuracy)")
    print(f"{'view':14s} {'window':>7s} {'windows':>8s} {'median |diff|':>14s} "
          f"{'p95 |diff|':>11s} {'median diff':>12s}")
    for r in rows:
        print(f"{r.view:14s} {r.window_s:>6g}s {r.windows:>8d} {r.median_abs_pct:>13.2f}% "
              f"{r.p95_abs_pct:>10.2f}% {r.median_pct:>+11.2f}%")
    return 0
