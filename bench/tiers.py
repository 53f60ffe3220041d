#!/usr/bin/env python3
"""Each test tier's wall time against its standing budget, and the worker count that is best.

    python bench/tiers.py                       # every tier at the suite's worker count
    python bench/tiers.py --tiers fast --workers 0,2
    python bench/tiers.py --tiers all --workers 1,2,3,4

Why a bench: the budgets (tests/tiers.py BUDGET_S) are promises later work must keep, but a
timed test fails on a loaded machine; this runs `pytest -m TIER -n N` in the checkout, with
collection, and prints the seconds against the budget. `all` is the whole suite, which is
how the worker count in pyproject's addopts was chosen. `-n 0` is no xdist at all.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import RESULTS, machine, write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.tiers import BUDGET_S, TIERS  # noqa: E402  (the budgets are the suite's own)

_SUMMARY = re.compile(r"^=* ?(\d+ (?:passed|failed|error).*?) in ([0-9.]+)s", re.M)


def run_tier(tier: str, workers: int) -> dict[str, Any]:
    """One pytest run of a tier (or ``all``): wall seconds, pytest's closing line, exit."""
    marker = [] if tier == "all" else ["-m", tier]
    argv = [sys.executable, "-m", "pytest", *marker, "-n", str(workers), "-q",
            "-p", "no:cacheprovider", "--durations=0", "--durations-min=5"]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    RESULTS.mkdir(parents=True, exist_ok=True)  # the failures' reasons, kept beside the JSON
    (RESULTS / f"tiers_{tier}_n{workers}.log").write_text(done.stdout + done.stderr)
    closing = _SUMMARY.findall(done.stdout)
    return {"tier": tier, "workers": workers, "seconds": round(seconds, 1),
            "budget_s": BUDGET_S.get(tier), "exit": done.returncode,
            "summary": closing[-1][0] if closing else done.stdout[-300:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiers", default="fast,system,bench",
                    help=f"comma-separated, of {', '.join(TIERS)} or all")
    ap.add_argument("--workers", default="2", help="comma-separated xdist worker counts")
    args = ap.parse_args()
    tiers = args.tiers.split(",")
    unknown = [t for t in tiers if t not in (*TIERS, "all")]
    if unknown:
        ap.error(f"--tiers: unknown {unknown}")
    try:
        counts = [int(n) for n in args.workers.split(",")]
    except ValueError:
        ap.error(f"--workers: expected integers, got {args.workers!r}")
    rows = [run_tier(t, n) for t in tiers for n in counts]
    print(f"{'tier':<8} {'workers':>7} {'seconds':>8} {'budget':>7}  result")
    for r in rows:
        budget = "" if r["budget_s"] is None else f"{r['budget_s']:.0f}"
        print(f"{r['tier']:<8} {r['workers']:>7} {r['seconds']:>8.1f} {budget:>7}  "
              f"{r['summary']}")
    path = write_json("tiers", {**machine(), "runs": rows})
    print(f"wrote {path}")
    over = [r for r in rows if r["budget_s"] is not None and r["seconds"] > r["budget_s"]]
    failed = [r for r in rows if r["exit"] != 0]
    return 1 if failed else (3 if over else 0)


if __name__ == "__main__":
    sys.exit(main())
