"""`wattlab report RUN [-o report.html]`: an HTML page with plots, PNGs beside it."""

from __future__ import annotations

import argparse
from typing import Any

from wattlab.analysis.models import OBJECTIVES
from wattlab.analysis.report import ReportOptions, build_report
from wattlab.arg_types import SLOWDOWN, InputFile, OutputFile, count


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "report", help="write an HTML report with plots of a run or sweep file",
        description="For a run file: power over time with phases and gaps, sample-level "
                    "zooms, energy per phase and source, and NVML against an external meter "
                    "(the calibration fit). For a sweep file (wattlab sweep -o): every model "
                    "family's curves with its leave-one-out error and the recommended "
                    "setting. One self-contained HTML file; the PNGs are written beside it.")
    p.add_argument("run", type=InputFile("run or sweep file"),
                   help="run file or sweep results file")
    p.add_argument("-o", "--output", type=OutputFile("report", overwrite=True),
                   help="HTML file to write (default: RUN with .html)")
    p.add_argument("--dpi", type=count(10, 1200), default=110,
                   help="resolution of the PNGs (default 110)")
    cal = p.add_argument_group("run files: NVML calibration panel")
    cal.add_argument("--reference", metavar="SRC[:CHANNEL]",
                     help="external meter to compare NVML with (default: the first non-NVML "
                          "power stream, as wattlab energy)")
    cal.add_argument("--calibrate", action="append", default=[], metavar="SRC[:CHANNEL]",
                     help="NVML reading to fit (repeatable; default: the records wattlab "
                          "calibrate stored in the run, else each GPU's averaged reading)")
    cal.add_argument("--no-calibration", action="store_true",
                     help="leave the calibration panel out (it fits for a few seconds)")
    sweep = p.add_argument_group("sweep files")
    sweep.add_argument("--objective", choices=OBJECTIVES, default="energy")
    sweep.add_argument("--max-slowdown", type=SLOWDOWN, metavar="F",
                       help="largest accepted slowdown vs the default setting, e.g. 0.05")
    return p


def run(args: argparse.Namespace) -> int:
    options = ReportOptions(dpi=args.dpi, reference=args.reference, calibrate=args.calibrate,
                            calibration=not args.no_calibration, objective=args.objective,
                            max_slowdown=args.max_slowdown)
    result = build_report(args.run, args.output, options)
    print(f"report: {result.html_path}")
    for png in result.png_paths:
        print(f"  figure: {png}")
    for note in result.notes:
        print(f"  note: {note}")
    return 0
