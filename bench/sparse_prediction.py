"""Sparse-sweep prediction on the Zeus A40/V100 traces: k of N settings, the optimum predicted.

    python bench/sparse_prediction.py [--draws 20] [--seed 0]

For each GPU × objective × k (2, 3, 4): leave-one-workload-out, each held-out workload
measured at k settings spread over its range (always the highest, the default), then at
the highest plus k − 1 random ones (``--draws`` seeded repetitions: mean ± std). Prints
the rate of picks equal to the measured best, within one 25 W step, the mean regret of
the objective and the share of picks over the slowdown bound; writes
results/sparse_prediction.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common import write_json
from wattlab.analysis.models import evaluate_sparse, load_table

ROOT = Path(__file__).resolve().parent.parent
TRACE = "zeus/examples/research_reproducibility/zeus_nsdi23/trace"
OBJECTIVES = (("energy", None), ("edp", None), ("energy", 0.05))
KS = (2, 3, 4)


def trace(gpu: str) -> str:
    """The published trace shipped in tests/data."""
    path = ROOT / "tests/data/public" / TRACE / f"summary_power_{gpu}.csv"
    if not path.exists():
        raise SystemExit(f"{path}: missing from this checkout")
    return str(path)


def cell(value: float, key: str, spread: dict[str, float] | None, digits: int = 0) -> str:
    """A percentage, ± its std over draws when there were draws."""
    text = f"{100 * value:.{digits}f}"
    return text + ("" if spread is None else f"±{100 * spread[key]:.{digits}f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = []
    head = (f"{'gpu':<5} {'objective':<16} {'k':>2} {'choice':<7} {'argmin':>9} "
            f"{'within 1':>9} {'regret %':>12} {'over bound':>10} {'s':>5}")
    print(head)
    for gpu in ("a40", "v100"):
        table = load_table(trace(gpu))
        for objective, bound in OBJECTIVES:
            name = objective if bound is None else f"{objective} ≤{bound:g} slow"
            for k in KS:
                for choice in ("spread", "random"):
                    t0 = time.perf_counter()
                    ev = evaluate_sparse(table, k, objective, bound, choice=choice,
                                         seed=args.seed, draws=args.draws)
                    took = time.perf_counter() - t0
                    pm = ev.spread if choice == "random" else None
                    print(f"{gpu:<5} {name:<16} {k:>2} {choice:<7} "
                          f"{cell(ev.hit_rate, 'hit_rate', pm):>9} "
                          f"{cell(ev.within_one_step_rate, 'within_one_step_rate', pm):>9} "
                          f"{cell(ev.mean_regret, 'mean_regret', pm, 2):>12} "
                          f"{cell(ev.violation_rate, 'violation_rate', pm):>10} {took:5.1f}")
                    rows.append({"gpu": gpu, "objective": objective, "max_slowdown": bound,
                                 "k": k, "choice": choice, "draws": ev.draws,
                                 "seed": ev.seed, "workloads": len(ev.workloads),
                                 "hit_rate": ev.hit_rate,
                                 "within_one_step_rate": ev.within_one_step_rate,
                                 "mean_regret": ev.mean_regret,
                                 "violation_rate": ev.violation_rate, "spread": ev.spread,
                                 "seconds": took,
                                 "misses": [r.workload for r in ev.workloads
                                            if not r.within_one_step]})
    path = write_json("sparse_prediction", {"rows": rows})
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
