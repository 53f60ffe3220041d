"""`wattlab report RUN [-o report.html]`: an HTML page with plots, PNGs beside it."""

from __future__ import annotations

import argparse
from typing import Any

from wattlab.analysis.report import build_report


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "report", help="write an HTML report with plots of a run file",
        description="Power over time with phases and gaps, sample-level zooms, energy per "
                    "phase and source (and calibration / model panels where available), as "
                    "one self-contained HTML file; the PNGs are written beside it.")
    p.add_argument("run", help="run file")
    p.add_argument("-o", "--output", help="HTML file to write (default: RUN with .html)")
    p.add_argument("--dpi", type=int, default=110, help="resolution of the PNGs (default 110)")
    return p


def run(args: argparse.Namespace) -> int:
    result = build_report(args.run, args.output, dpi=args.dpi)
    print(f"report: {result.html_path}")
    for png in result.png_paths:
        print(f"  figure: {png}")
    for note in result.notes:
        print(f"  note: {note}")
    return 0
