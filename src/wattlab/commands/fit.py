"""`wattlab fit SWEEP`: energy/EDP models with leave-one-out validation and a setting."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from wattlab.analysis.many_runs import map_runs
from wattlab.analysis.models import (
    CHOICES,
    FAMILIES,
    MAX_BOOST_HOLDOUT,
    OBJECTIVES,
    X_NAMES,
    FitReport,
    SweepTable,
    choose_per_phase,
    concat,
    evaluate_sparse,
    fit_sweep,
    format_phase_report,
    load_table,
    recommend_sparse,
)
from wattlab.analysis.report import format_evaluation, format_recommendation
from wattlab.arg_types import JOBS, SEED, SLOWDOWN, count
from wattlab.errors import UsageError, WattlabError

UNITS = {"power_limit_w": "W", "sm_clock_mhz": "MHz", "mem_clock_mhz": "MHz"}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "fit", help="fit time/power/energy/EDP against a setting and recommend one",
        description="SWEEP is a wattlab sweep file, a Zeus summary_power_*.csv or profile "
                    "CSV (or a folder of them), or a Kernel Tuner cache JSON.")
    p.add_argument("sweep", nargs="+",
                   help="sweep results file or published table; several are read in "
                        "parallel (--jobs) and fitted as one table")
    p.add_argument("--jobs", "-j", type=JOBS, metavar="N",
                   help="worker processes reading several tables (default: one per CPU)")
    p.add_argument("--x", choices=tuple(X_NAMES), help="setting to fit against "
                   "(default: the one the sweep varied)")
    p.add_argument("--objective", choices=OBJECTIVES, default="energy")
    p.add_argument("--max-slowdown", type=SLOWDOWN, metavar="F",
                   help="largest accepted slowdown vs the default setting, e.g. 0.05 "
                        "(default: no bound)")
    p.add_argument("--families", default=",".join(FAMILIES),
                   help=f"model families to compare (default: {','.join(FAMILIES)})")
    p.add_argument("--workload", help="only workloads whose name contains this text")
    p.add_argument("--max-boost-holdout", type=count(), default=MAX_BOOST_HOLDOUT, metavar="N",
                   help="rows held out for the boosted family's LOO (it refits per row; "
                        f"default {MAX_BOOST_HOLDOUT})")
    p.add_argument("--top", type=count(0), default=20, metavar="N",
                   help="workloads to print (default 20; --json has all)")
    p.add_argument("--by-phase", action="store_true",
                   help="also choose the best setting per marked phase (sweep files whose "
                        "workload used wattlab.phase)")
    p.add_argument("--measured", type=count(0), metavar="K",
                   help="sparse-sweep backtest: hold out each workload, keep K of its "
                        "settings, predict its best setting from the other workloads")
    p.add_argument("--choice", choices=CHOICES, default="spread",
                   help="which K settings --measured keeps (always the highest): spread "
                        "over the range, or random (default spread)")
    p.add_argument("--seed", type=SEED, default=0, help="random seed (--choice random, "
                   "--sparse bootstrap; default 0)")
    p.add_argument("--draws", type=count(), default=20, metavar="N",
                   help="--choice random: repetitions of the backtest (default 20)")
    p.add_argument("--sparse", metavar="WORKLOAD",
                   help="recommend a setting for WORKLOAD, measured at a few settings, from "
                        "the other workloads' full sweeps in the same table")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def _run_sparse(args: argparse.Namespace, table: SweepTable) -> int:
    """``--measured K`` (backtest) or ``--sparse WORKLOAD`` (a recommendation)."""
    unit = UNITS.get(table.x_name, "")
    if args.measured is not None:
        ev = evaluate_sparse(table, args.measured, args.objective, args.max_slowdown,
                             choice=args.choice, seed=args.seed, draws=args.draws)
        out, text = ev.to_json(), format_evaluation(ev, unit, args.top)
    else:
        rec = recommend_sparse(table, args.sparse, args.objective, args.max_slowdown,
                               seed=args.seed)
        out, text = rec.to_json(), format_recommendation(rec, unit)
    print(json.dumps(out, indent=1, allow_nan=True) if args.json else text)
    return 0


def format_report(report: FitReport, top: int) -> str:
    """A terminal table: LOO MAPE per family, then the recommendation per workload."""
    unit = UNITS.get(report.x_name, "")
    q = "edp" if report.objective == "edp" else report.objective
    lines = [f"{report.origin}: {report.n_rows} rows, {report.n_workloads} workload(s), "
             f"x = {report.x_name}, objective {report.objective}, max slowdown "
             f"{'none' if report.max_slowdown is None else f'{report.max_slowdown:g}'}",
             "leave-one-out MAPE (%):",
             f"  {'family':<10} {'held out':>8} {'time':>7} {'power':>7} {'energy':>7} "
             f"{'edp':>7} {q + ' (compared)':>16}"]
    for s in report.families:
        if s.n_heldout == 0:  # e.g. boosted on one workload: nothing to learn across
            lines.append(f"  {s.family:<10} {'-':>8}  not cross-validated: no row to hold out")
            continue
        mark = "  <- chosen" if s.family == report.chosen else ""
        lines.append(f"  {s.family:<10} {s.n_predicted:>4}/{s.n_heldout:<3} "
                     + " ".join(f"{s.mape[k]:7.2f}" for k in ("time", "power", "energy", "edp"))
                     + f" {s.mape_common[q]:16.2f}{mark}")
    lines.append(f"recommended settings ({report.chosen}; saving vs default, 95 % interval):")
    for r in report.recommendations[:top]:
        measured = "-" if r.measured_saving is None else f"{100 * r.measured_saving:.1f} %"
        lines.append(f"  {r.workload}: {r.recommended_x:g} {unit} (default {r.default_x:g}) "
                     f"saves {100 * r.predicted_saving:.1f} % "
                     f"[{100 * r.saving_interval[0]:.1f}, {100 * r.saving_interval[1]:.1f}] "
                     f"for {100 * r.predicted_slowdown:+.1f} % time; measured best "
                     f"{r.measured_best_x:g} {unit}, measured saving {measured}")
    if len(report.recommendations) > top:
        lines.append(f"  ... {len(report.recommendations) - top} more (see --json)")
    if not math.isnan(report.agreement):
        lines.append(f"recommended = measured best in {100 * report.agreement:.0f} % of workloads")
    return "\n".join(lines)


def load_tables(paths: list[str], jobs: int | None) -> SweepTable:
    """One table, or several read in worker processes and joined (same setting axis)."""
    if len(paths) == 1:
        return load_table(paths[0])
    outcomes = list(map_runs(load_table, paths, jobs))
    failed = [o for o in outcomes if o.error]
    if failed:
        error = UsageError if all(o.usage for o in failed) else WattlabError
        raise error("; ".join(o.error for o in failed))
    return concat([o.result for o in outcomes], origin=", ".join(paths))


def run(args: argparse.Namespace) -> int:
    table = load_tables(args.sweep, args.jobs)
    if args.x is not None:
        table = table.with_x(X_NAMES[args.x])
    if args.workload:
        keep = [args.workload in w for w in table.workload]
        if not any(keep):
            raise UsageError(f"{table.origin}: no workload name contains {args.workload!r}")
        import numpy as np

        table = table.select(np.array(keep))
    if args.measured is not None or args.sparse is not None:
        if args.measured is not None and args.sparse is not None:
            raise UsageError("--measured (backtest) and --sparse (recommend) exclude each other")
        return _run_sparse(args, table)
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    if not args.by_phase:
        report = fit_sweep(table, args.objective, args.max_slowdown, families=families,
                           max_boost_holdout=args.max_boost_holdout)
        if args.json:
            print(json.dumps(report.to_json(), indent=1, allow_nan=True))
        else:
            print(format_report(report, args.top))
        return 0
    phases = choose_per_phase(table, args.objective, args.max_slowdown)
    out: dict[str, Any] = {}
    text: list[str] = []
    try:  # a phase sweep may have too few settings to cross-validate the whole-run models
        whole = fit_sweep(table, args.objective, args.max_slowdown, families=families,
                          max_boost_holdout=args.max_boost_holdout)
        out = whole.to_json()
        text.append(format_report(whole, args.top))
    except UsageError as e:
        out = {"origin": table.origin, "x_name": table.x_name, "objective": args.objective,
               "max_slowdown": args.max_slowdown, "fit_error": str(e)}
        text.append(f"{table.origin}: whole-run models not fitted: {e}")
    out["by_phase"] = phases.to_json()
    if args.json:
        print(json.dumps(out, indent=1, allow_nan=True))
    else:
        print("\n".join(text))
        print(format_phase_report(phases, UNITS.get(table.x_name, "")))
    return 0
