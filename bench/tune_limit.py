"""What no search can beat: the tuner's goal for a certifier told every surface in advance.

    python bench/tune_limit.py                          # 10000 iterations, 2 % noise
    python bench/tune_limit.py --iterations 100000

Why: bench/tune_sim.py measures the search against the oracle; this bounds what *any*
search could reach under the same rule for keeping a setting (its measured slowdown plus
``z_bound`` standard errors within the bound, tuning/search.py). The certifier here knows
each surface: it runs the setting easiest to certify among those with >= 95 % of the
oracle's saving and a true slowdown within the bound from the first iteration (free: it
is the kept setting) and spends the whole exploring share (4.8 %, as the search's) on the
default, the reference every slowdown is measured against. Per surface, the chance that
its estimate comes out certifiable at the run's end, ``Phi((bound - s) / se - z)``, with
``se = (1 + s) sigma sqrt(1 / n_kept + 1 / n_default)``. A search must also find the
setting and pays for every other iteration, so it meets the goal less often than this.
Printed per table: surfaces, the expected number meeting the goal, how many have less
than a 50 % (and a 95 %) chance, and the chance that the goal holds on every one at once.
"""

from __future__ import annotations

import math

from common import DATA, write_json
from tune_sim import run_parser, sample
from wattlab.tuning.refine import p_within
from wattlab.tuning.search import SearchConfig
from wattlab.tuning.surfaces import Surface, public_surfaces

PUBLIC = DATA / "public"


def p_goal(surface: Surface, cfg: SearchConfig, iterations: int, noise: float) -> float:
    """The foreknowing certifier's chance to meet the goal on ``surface`` (energy objective)."""
    d = surface.default
    e0, t0 = float(surface.energy_j[d]), float(surface.time_s[d])
    oracle = surface.oracle("energy", cfg.max_slowdown)
    need = 0.95 * (1.0 - float(surface.energy_j[oracle]) / e0)
    best = 0.0
    for idx in surface.indices():
        e, slow = float(surface.energy_j[idx]), float(surface.time_s[idx]) / t0 - 1.0
        if slow > cfg.max_slowdown or 1.0 - e / e0 < need - 1e-12:
            continue
        if idx == d:
            return 1.0  # the default itself qualifies: nothing to certify
        # default iterations the share allows: n0 e0 <= share (n0 e0 + (N - n0) e)
        n0 = math.floor(cfg.explore_share * iterations * e
                        / (e0 * (1.0 - cfg.explore_share) + cfg.explore_share * e))
        if n0 < 2:
            continue
        se = (1.0 + slow) * noise * math.sqrt(1.0 / (iterations - n0) + 1.0 / n0)
        best = max(best, p_within(slow + cfg.z_bound * se, se, cfg.max_slowdown))
    return best


def main() -> None:
    ap = run_parser(__doc__)
    args = ap.parse_args()
    cfg = SearchConfig(max_slowdown=args.max_slowdown, expected_iterations=args.iterations)
    rows = []
    print(f"{'table':16s} {'n':>4s} {'expected':>8s} {'p<50%':>6s} {'p<95%':>6s} "
          f"{'P(all)':>8s}")
    for table, surfaces in public_surfaces(PUBLIC).items():
        ps = [p_goal(s, cfg, args.iterations, args.noise) for s in sample(surfaces, args.quick)]
        row = {"table": table, "surfaces": len(ps), "expected_met": sum(ps),
               "below_half": sum(p < 0.5 for p in ps), "below_95": sum(p < 0.95 for p in ps),
               "p_all": math.prod(ps)}
        rows.append(row)
        print(f"{table:16s} {len(ps):4d} {row['expected_met']:8.1f} {row['below_half']:6d} "
              f"{row['below_95']:6d} {row['p_all']:8.2g}")
    total = sum(r["expected_met"] for r in rows)
    p_all = math.prod(r["p_all"] for r in rows)
    print(f"all: expected {total:.1f} of {sum(r['surfaces'] for r in rows)}, "
          f"P(every surface) {p_all:.2g}")
    write_json(f"tune_limit_{args.iterations}", {
        "iterations": args.iterations, "noise": args.noise, "max_slowdown": args.max_slowdown,
        "z_bound": cfg.z_bound, "explore_share": cfg.explore_share, "rows": rows,
        "expected_met": total, "p_every_surface": p_all})


if __name__ == "__main__":
    main()
