"""`wattlab iterations RUN --source SRC[:CHANNEL]`: training iterations, from markers or power."""

from __future__ import annotations

import argparse
import json
from typing import Any

from wattlab.analysis.iterations import IterationResult, iterations
from wattlab.arg_types import RATE_HZ, SESSION_TIME_S, InputFile, seconds
from wattlab.runfile import Run


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "iterations", help="find the iteration period and energy per iteration")
    p.add_argument("run", type=InputFile("run file"), help="run file")
    p.add_argument("--source", required=True, metavar="SRC[:CHANNEL]", help="power stream")
    p.add_argument("--markers", default="auto", metavar="NAME",
                   help="step markers to count iterations by: a marker name, auto (step, "
                        "then optimizer_step, if present) or none (power only)")
    p.add_argument("--min-period", type=seconds(3600), default=0.01, metavar="S",
                   help="bursts closer than this are one step (default 0.01)")
    p.add_argument("--max-period", type=seconds(), default=None, metavar="S",
                   help="longest iteration; longer stretches are pauses (default: no limit; "
                        "autocorrelation: a quarter of the stream)")
    p.add_argument("--rate", type=RATE_HZ, default=None, metavar="HZ",
                   help="autocorrelation grid (default: from the stream's rate, at most 1 kHz)")
    p.add_argument("--from", dest="t0", type=SESSION_TIME_S, default=None, metavar="S",
                   help="start (session seconds)")
    p.add_argument("--to", dest="t1", type=SESSION_TIME_S, default=None, metavar="S",
                   help="end (session seconds)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if the stream's figure over the span fails a validity check "
                        "(docs/validity.md); without it the failure is a warning, exit 0")
    return p


def run(args: argparse.Namespace) -> int:
    with Run(args.run) as run_file:
        result = iterations(run_file, args.source, markers=args.markers, rate_hz=args.rate,
                            min_period_s=args.min_period, max_period_s=args.max_period,
                            t0_s=args.t0, t1_s=args.t1)
    status = int(args.strict and result.valid is False)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return status
    print(describe(args.source, result))
    return status


def describe(source: str, r: IterationResult) -> str:
    """Text lines: method, count, period, energy per iteration, warnings."""
    by = f"{r.method} ({r.markers})" if r.markers else r.method
    if r.period_s is None:
        lines = [f"{source}: no iterations found by {by} (confidence 0)"]
    else:
        iqr = f", IQR {r.period_iqr_s * 1e3:.2f} ms" if r.period_iqr_s is not None else ""
        se = f" ± {r.period_se_s * 1e3:.2f}" if r.period_se_s is not None else ""
        lines = [f"{source}: {r.count} iterations by {by}, period {r.period_s * 1e3:.2f}{se} "
                 f"ms{iqr}, confidence {r.confidence:.2f}"]
        if r.groups is not None and r.group_period_s is not None:
            lines.append(f"  in {r.groups} groups of ~{r.steps_per_group:.0f} steps, "
                         f"{r.group_period_s * 1e3:.0f} ms apart (the power bursts once a group)")
        if r.energy_per_iteration_j is not None:
            es = r.energy_per_iteration_se_j
            pm = f" ± {es:.3f}" if es is not None else ""
            lines.append(f"  mean power {r.mean_power_w:.2f} W, energy per iteration "
                         f"{r.energy_per_iteration_j:.3f}{pm} J")
    if not r.resolvable:
        lines.append("  single steps are not resolvable in this stream")
    if r.method == "steps-in-bursts" and r.confidence < 0.3:
        lines.append("  low confidence: the steps inside the bursts are told apart by their "
                     "rhythm alone")
    elif r.method != "markers" and r.confidence < 0.3:
        lines.append("  low confidence: the power may not repeat (or the period is out of "
                     "range)")
    lines += [f"  warning: {w}" for w in r.warnings]
    return "\n".join(lines)
