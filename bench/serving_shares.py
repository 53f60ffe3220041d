"""Each request's share of a shared serving run against the same request served alone.

    python bench/serving_shares.py SHARED.h5 EXCLUSIVE.h5 [--rule alone] [--name NAME]

Both runs carry a request table (`wattlab import requests LOG --into RUN`). The shared run's
requests are split by ``energy --by-request --rule RULE``; the exclusive run served the same
requests one at a time, so there each interval's energy above idle belongs to the one request
in flight (rule ``in-flight``, which has nothing to share). A request's share is its energy
over the sum of all requests' in that run; issue 40's goal is each share within 10 % of the
exclusive one. Prints a table and writes the side-by-side rows to
bench/results/serving_shares[_NAME].json. Exit 0 whether the goal is met or not: the numbers
are the finding; exit 2 on runs that cannot be compared.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from common import write_json
from wattlab.analysis.attribution import energy_by_request
from wattlab.errors import UsageError
from wattlab.runfile.reader import Run

GOAL = 0.10


def request_energy_j(path: str, rule: str) -> tuple[dict[str, float], dict[str, Any]]:
    """Each request's energy above idle in ``path`` by ``rule``, and the split's summary."""
    with Run(path) as run:
        split = energy_by_request(run, rule=rule)
    return ({r.id: r.energy_j for r in split.requests},
            {"idle_w": split.attribution.idle_w, "idle_how": split.idle_how,
             "notes": split.attribution.notes, **split.summary()})


def compare(shared_j: dict[str, float], exclusive_j: dict[str, float]) -> dict[str, Any]:
    """Shares of the requests in both runs, side by side, and how far apart they are."""
    ids = sorted(set(shared_j) & set(exclusive_j))
    if len(ids) < 2:
        raise UsageError(f"{len(ids)} request(s) in both runs: nothing to compare")
    shared = np.array([shared_j[i] for i in ids])
    alone = np.array([exclusive_j[i] for i in ids])
    if shared.sum() <= 0 or alone.sum() <= 0 or np.any(alone <= 0):
        raise UsageError("a request with no energy above idle in the exclusive run: its share "
                         "cannot be compared")
    error = (shared / shared.sum()) / (alone / alone.sum()) - 1
    rows = [{"id": i, "shared_j": float(s), "exclusive_j": float(a), "share_error": float(e)}
            for i, s, a, e in zip(ids, shared, alone, error, strict=True)]
    return {"requests": len(ids), "only_shared": sorted(set(shared_j) - set(exclusive_j)),
            "only_exclusive": len(set(exclusive_j) - set(shared_j)),
            "median": float(np.median(error)), "p10": float(np.quantile(error, 0.1)),
            "p90": float(np.quantile(error, 0.9)), "worst": float(error[np.abs(error).argmax()]),
            "within_goal": float(np.mean(np.abs(error) <= GOAL)), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shared")
    parser.add_argument("exclusive")
    parser.add_argument("--rule", default="alone", help="the shared run's --by-request rule")
    parser.add_argument("--name", default="", help="suffix of the result's JSON file")
    args = parser.parse_args(argv)
    try:
        shared_j, shared_about = request_energy_j(args.shared, args.rule)
        exclusive_j, exclusive_about = request_energy_j(args.exclusive, "in-flight")
        result = compare(shared_j, exclusive_j)
    except (UsageError, OSError) as e:
        print(f"serving_shares: {e}", file=sys.stderr)
        return 2
    print(f"{result['requests']} requests in both runs ({len(result['only_shared'])} only "
          f"shared, {result['only_exclusive']} only exclusive); rule {args.rule}")
    print("| share error | median | p10 | p90 | worst | within 10 % |")
    print("|---|---|---|---|---|---|")
    print(f"| shared vs exclusive | {result['median']:+.1%} | {result['p10']:+.1%} | "
          f"{result['p90']:+.1%} | {result['worst']:+.1%} | {result['within_goal']:.0%} |")
    for about, what in ((shared_about, "shared"), (exclusive_about, "exclusive")):
        print(f"{what}: idle {about['idle_w']:.1f} W ({about['idle_how']}); J/output token "
              f"median {about['j_per_output_token_median']:.3f}")
    name = "serving_shares" + (f"_{args.name}" if args.name else "")
    path = write_json(name, {"shared": args.shared, "exclusive": args.exclusive,
                             "rule": args.rule, "shared_split": shared_about,
                             "exclusive_split": exclusive_about, **result})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
