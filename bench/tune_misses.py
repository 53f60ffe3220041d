"""Which surfaces miss the tuner's goal, which criterion fails, and what it would take.

    python bench/tune_misses.py                       # 10000 iterations, every surface
    python bench/tune_misses.py --iterations 100000   # a longer run
    python bench/tune_misses.py --quick               # at most 20 surfaces per table

The same runs as bench/tune_sim.py (same seeds, same noise). For every surface that misses
(>= 95 % of the oracle's saving, true slowdown within the bound, <= 5 % of the run's energy
exploring): the oracle's and the kept setting's true slowdown and saving, steps between
them, exploration, the iterations measured at the oracle and the default, and a class:

- ``bound``: the kept setting's true slowdown is over the bound (a violation);
- ``explore``: more than 5 % of the run's energy was spent exploring;
- ``unmeasured``: the oracle was never measured;
- ``certify``: the oracle's measured slowdown plus ``z_bound`` standard errors is over the
  bound at the end of the run: the tuner could not keep it;
- ``close``: the oracle was certified within the bound, yet its measured objective did not
  come out better than the kept setting's: the two are closer than the noise resolved.

``cert it``: iterations at the oracle and at the default (each) for a 50 % chance that
the oracle's slowdown plus ``z_bound`` standard errors comes out within the bound, at the
run's noise: ``2 (z sigma / (bound - slowdown))^2``. ``apart it``: iterations (each) to
tell the two settings' objectives apart at two standard errors: ``2 (2 sigma / gap)^2``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from common import DATA, write_json
from tune_sim import run_parser, sample
from wattlab.tuning.search import SearchConfig
from wattlab.tuning.surface_run import SurfaceOutcome, simulate
from wattlab.tuning.surfaces import Surface, public_surfaces

PUBLIC = DATA / "public"


def classify(o: SurfaceOutcome, cfg: SearchConfig) -> str:
    """The first failing criterion's class (see the module docstring)."""
    if not o.within_bound(cfg.max_slowdown):
        return "bound"
    if not o.cheap():
        return "explore"
    if _measured(o, o.oracle) < 2:
        return "unmeasured"
    slow, se = o.search.slowdown(o.oracle)
    return "certify" if slow + cfg.z_bound * se > cfg.max_slowdown else "close"


def _measured(o: SurfaceOutcome, index: tuple[int, ...]) -> int:
    probe = o.search.probes.get(index)
    return len(probe.energy_j) if probe is not None else 0


def spent_by_purpose(o: SurfaceOutcome) -> dict[str, int]:
    """Iterations run for each purpose (baseline, spread, model, local, revisit, sweep)."""
    out: Counter[str] = Counter()
    marks = [*o.search.decisions, {"iteration": o.iterations, "action": "end"}]
    default = o.search.setting(o.search.default)
    for a, b in itertools.pairwise(marks):
        action = a["action"] + ("-default" if a["action"] == "revisit"
                                and a["setting"] == default else "")
        out[action] += b["iteration"] - a["iteration"]
    out.pop("settle", None)
    return dict(out)


def miss_row(table: str, surface: Surface, o: SurfaceOutcome, cfg: SearchConfig,
             noise: float) -> dict[str, Any]:
    oracle = o.oracle
    margin = cfg.max_slowdown - o.oracle_slowdown
    cert = 2 * (cfg.z_bound * noise / margin) ** 2 if margin > 0 else float("inf")
    gap = abs(o.energy_gap_pct) / 100
    apart = 2 * (2 * noise / gap) ** 2 if gap > 0 else float("inf")
    est = o.search.slowdown(oracle) if oracle in o.search.probes else (float("nan"),) * 2
    return {"table": table, "surface": o.surface, "class": classify(o, cfg),
            "fails": [name for name, ok in (("saving", o.saving_kept()),
                                            ("bound", o.within_bound(cfg.max_slowdown)),
                                            ("explore", o.cheap())) if not ok],
            "oracle_slowdown": o.oracle_slowdown, "oracle_saving": o.oracle_saving,
            "kept_slowdown": o.settled_slowdown, "kept_saving": o.settled_saving,
            "share_of_oracle": o.settled_saving / o.oracle_saving if o.oracle_saving else 1.0,
            "steps": o.steps_from_oracle, "explore_pct": 100 * o.explore_energy_frac,
            "explore_iterations": o.explore_iterations, "settled_at": o.settled_at,
            "oracle_iterations": _measured(o, oracle),
            "default_iterations": _measured(o, surface.default),
            "oracle_slowdown_estimate": est[0], "oracle_slowdown_se": est[1],
            "certify_iterations": cert, "apart_iterations": apart,
            "spent": spent_by_purpose(o)}


def main() -> None:
    ap = run_parser(__doc__)
    ap.add_argument("--seed-offset", type=int, default=0,
                    help="other noise than bench/tune_sim.py's (which is offset 0)")
    ap.add_argument("--z-bound", type=float, default=SearchConfig.z_bound,
                    help="standard errors of margin a kept setting needs (the trade-off "
                         "between violations and savings)")
    args = ap.parse_args()
    cfg = SearchConfig(max_slowdown=args.max_slowdown, expected_iterations=args.iterations,
                       z_bound=args.z_bound)
    misses, totals = [], {}
    for table, surfaces in public_surfaces(PUBLIC).items():
        picked = sample(surfaces, args.quick)
        met = 0
        for i, s in enumerate(picked):  # seeds as bench/tune_sim.py's
            o = simulate(s, cfg, args.iterations, args.noise, seed=i + args.seed_offset)
            if o.goal(cfg.max_slowdown):
                met += 1
            else:
                misses.append(miss_row(table, s, o, cfg, args.noise))
        totals[table] = {"surfaces": len(picked), "goal_met": met}
    print(f"{'surface':34s} {'class':10s} {'or slow':>7s} {'or save':>7s} {'kp slow':>7s} "
          f"{'kp save':>7s} {'share':>5s} {'steps':>5s} {'expl%':>5s} {'settled':>7s} "
          f"{'or n':>5s} {'def n':>5s} {'or est':>6s} {'se':>5s} {'cert it':>7s} {'apart it':>8s}")
    for m in misses:
        print(f"{m['surface'][:34]:34s} {m['class']:10s} {m['oracle_slowdown']:+7.2%} "
              f"{m['oracle_saving']:7.2%} {m['kept_slowdown']:+7.2%} {m['kept_saving']:7.2%} "
              f"{m['share_of_oracle']:5.2f} {m['steps']:5d} {m['explore_pct']:5.2f} "
              f"{m['settled_at'] or -1:7d} {m['oracle_iterations']:5d} "
              f"{m['default_iterations']:5d} {m['oracle_slowdown_estimate']:+6.2%} "
              f"{m['oracle_slowdown_se']:5.2%} {m['certify_iterations']:7.0f} "
              f"{m['apart_iterations']:8.0f} "
              + " ".join(f"{k}:{v}" for k, v in m["spent"].items()))
    classes = Counter(m["class"] for m in misses)
    for table, t in totals.items():
        per = Counter(m["class"] for m in misses if m["table"] == table)
        print(f"{table:16s} goal {t['goal_met']}/{t['surfaces']}  misses: "
              + (", ".join(f"{k} {v}" for k, v in sorted(per.items())) or "none"))
    print(f"all: goal {sum(t['goal_met'] for t in totals.values())}/"
          f"{sum(t['surfaces'] for t in totals.values())}, violations {classes['bound']}, "
          + ", ".join(f"{k} {v}" for k, v in sorted(classes.items())))
    write_json(f"tune_misses_{args.iterations}_z{args.z_bound:g}_s{args.seed_offset}", {
        "iterations": args.iterations, "noise": args.noise, "max_slowdown": args.max_slowdown,
        "z_bound": args.z_bound, "seed_offset": args.seed_offset, "quick": args.quick,
        "totals": totals, "classes": dict(classes), "misses": misses})


if __name__ == "__main__":
    main()
