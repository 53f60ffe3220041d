"""`wattlab tune`'s search on every published surface, against the oracle.

    python bench/tune_sim.py                 # every surface, 10000 iterations, 2 % noise
    python bench/tune_sim.py --quick         # at most 20 surfaces per table

Each surface (tuning/surfaces.py: Zeus A40/V100 power limits, Kernel Tuner RTX 4000 Ada
and A100 SM clocks, Ulisboa Titan X SM x memory clocks) is a simulated training run whose
iterations cost what the table says at the setting in force, times lognormal noise. Per
table: how often the goals hold (>= 95 % of the oracle's saving, true slowdown within the
bound, <= 5 % of the run's energy spent before settling), mean saving vs the oracle's,
distance to the oracle in setting steps and % energy, iterations and energy spent
exploring. GPOEO's published headline is printed beside it (a different GPU and
workloads: context, not a like-for-like comparison).
"""

from __future__ import annotations

import argparse

import numpy as np

from common import DATA, write_json
from wattlab.tuning.search import SearchConfig
from wattlab.tuning.surface_run import simulate
from wattlab.tuning.surfaces import Surface, public_surfaces

PUBLIC = DATA / "public"
GPOEO = {"energy_saving": 0.162, "slowdown": 0.051, "gpu": "RTX 3080 Ti", "workloads": 71}


def run_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the simulated runs (bench/tune_misses.py reruns the same ones)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iterations", type=int, default=10000)
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--max-slowdown", type=float, default=0.05)
    return ap


def sample(surfaces: list[Surface], quick: bool) -> list[Surface]:
    """Every surface, or at most 20 spread over the table (``--quick``)."""
    return surfaces[:: max(1, len(surfaces) // 20)] if quick else surfaces


def main() -> None:
    ap = run_parser(__doc__)
    ap.add_argument("--objective", default="energy")
    args = ap.parse_args()
    cfg = SearchConfig(objective=args.objective, max_slowdown=args.max_slowdown,
                       expected_iterations=args.iterations)
    rows = []
    print(f"{'table':16s} {'n':>4s} {'goal':>5s} {'bound':>5s} {'<=5%':>5s} {'save':>6s} "
          f"{'oracle':>6s} {'steps':>5s} {'gap%':>5s} {'expl it':>7s} {'expl E%':>7s} "
          f"{'run save':>8s} {'slow':>6s}")
    for table, surfaces in public_surfaces(PUBLIC).items():
        picked = sample(surfaces, args.quick)
        outs = [simulate(s, cfg, args.iterations, args.noise, seed=i)
                for i, s in enumerate(picked)]
        within = [o.within_bound(args.max_slowdown) for o in outs]
        cheap = [o.cheap() for o in outs]
        goal = [o.goal(args.max_slowdown) for o in outs]
        row = {"table": table, "surfaces": len(outs), "goal_met": int(sum(goal)),
               "within_bound": int(sum(within)), "explore_le_5pct": int(sum(cheap)),
               "mean_saving": float(np.mean([o.settled_saving for o in outs])),
               "mean_oracle_saving": float(np.mean([o.oracle_saving for o in outs])),
               "mean_steps_from_oracle": float(np.mean([o.steps_from_oracle for o in outs])),
               "mean_gap_pct": float(np.mean([o.energy_gap_pct for o in outs])),
               "mean_explore_iterations": float(np.mean([o.explore_iterations for o in outs])),
               "max_explore_energy_pct": 100 * max(o.explore_energy_frac for o in outs),
               "mean_run_saving": float(np.mean([o.run_saving for o in outs])),
               "mean_slowdown": float(np.mean([o.settled_slowdown for o in outs]))}
        rows.append(row)
        print(f"{table:16s} {len(outs):4d} {sum(goal):5d} {sum(within):5d} {sum(cheap):5d} "
              f"{row['mean_saving']:6.1%} {row['mean_oracle_saving']:6.1%} "
              f"{row['mean_steps_from_oracle']:5.2f} {row['mean_gap_pct']:5.2f} "
              f"{row['mean_explore_iterations']:7.0f} {row['max_explore_energy_pct']:7.2f} "
              f"{row['mean_run_saving']:8.1%} {row['mean_slowdown']:+6.1%}")
    print(f"GPOEO (published): energy -{GPOEO['energy_saving']:.1%}, time "
          f"+{GPOEO['slowdown']:.1%}, {GPOEO['gpu']}, mean of {GPOEO['workloads']} workloads")
    write_json("tune_sim", {"rows": rows, "gpoeo": GPOEO, "iterations": args.iterations,
                            "noise": args.noise, "max_slowdown": args.max_slowdown,
                            "objective": args.objective})


if __name__ == "__main__":
    main()
