"""`wattlab iterations RUN --source SRC[:CHANNEL]`: period of repeating work from power."""

from __future__ import annotations

import argparse
import json
from typing import Any

from wattlab.analysis.iterations import iterations
from wattlab.analysis.run_file import Run


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "iterations", help="find the iteration period and energy per iteration")
    p.add_argument("run", help="run file")
    p.add_argument("--source", required=True, metavar="SRC[:CHANNEL]", help="power stream")
    p.add_argument("--min-period", type=float, default=0.01, metavar="S")
    p.add_argument("--max-period", type=float, default=None, metavar="S",
                   help="longest period to consider (default: a quarter of the stream)")
    p.add_argument("--rate", type=float, default=None, metavar="HZ",
                   help="analysis grid (default: from the stream's rate, at most 1 kHz)")
    p.add_argument("--from", dest="t0", type=float, default=None, metavar="S",
                   help="start (session seconds)")
    p.add_argument("--to", dest="t1", type=float, default=None, metavar="S",
                   help="end (session seconds)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def run(args: argparse.Namespace) -> int:
    with Run(args.run) as run_file:
        result = iterations(run_file, args.source, rate_hz=args.rate,
                            min_period_s=args.min_period, max_period_s=args.max_period,
                            t0_s=args.t0, t1_s=args.t1)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    if result.period_s is None:
        print(f"{args.source}: no repeating pattern found (confidence 0)")
        return 0
    se_ms = (result.period_se_s or 0.0) * 1e3
    print(f"{args.source}: period {result.period_s * 1e3:.2f} ± {se_ms:.2f} ms, "
          f"confidence {result.confidence:.2f}, {result.iterations} iterations")
    e, es = result.energy_per_iteration_j or 0.0, result.energy_per_iteration_se_j or 0.0
    print(f"  mean power {result.mean_power_w:.2f} W, energy per iteration {e:.3f} ± "
          f"{es:.3f} J")
    if result.confidence < 0.3:
        print("  low confidence: the power may not repeat (or the period is out of range)")
    return 0
