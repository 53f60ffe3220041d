"""Two `wattlab qualify --json` results of one GPU side by side: does x repeat?

    python bench/qualify_repeat.py FIRST.json SECOND.json

Per target: x % of each run with its ± (the scatter of its level's windows), their
difference in points, whether it is within ``GOAL_POINTS`` (the goal of issue 37) and
whether it is within twice the two runs' combined ± (what the windows say a repeat can
promise). Used by bench/device_qualify_37.sh on the lent GPU, where the two
runs are separate commands. Exit 0 whether the goal is met or not: the numbers are the
finding; exit 2 on a result that cannot be compared.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

GOAL_POINTS = 0.2


def repeat_rows(first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, Any]]:
    """Per target scored in both: its x in each and the difference (None where unscored)."""
    def scores(doc: dict[str, Any]) -> dict[str, tuple[float | None, float | None]]:
        return {t["target"] + (" corrected" if t["corrected"] else ""):
                (t["x_pct"], t.get("x_pm_pct")) for t in doc["targets"] if not t["refused"]}

    a, b = scores(first), scores(second)
    rows = []
    for name in [n for n in a if n in b]:
        (x1, pm1), (x2, pm2) = a[name], b[name]
        diff = None if x1 is None or x2 is None else x2 - x1
        pm = None if pm1 is None or pm2 is None else math.hypot(pm1, pm2)
        rows.append({"target": name, "x1_pct": x1, "x2_pct": x2, "x1_pm_pct": pm1,
                     "x2_pm_pct": pm2, "difference_points": diff, "difference_pm_points": pm,
                     "within_goal": diff is not None and abs(diff) <= GOAL_POINTS,
                     "within_scatter": None if diff is None or pm is None
                     else abs(diff) <= 2 * pm})
    return rows


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        docs = [json.loads(Path(path).read_text(encoding="utf-8")) for path in sys.argv[1:]]
    except (OSError, ValueError) as e:
        print(f"qualify_repeat: {e}", file=sys.stderr)
        return 2
    print(f"reference {docs[0]['reference']}: {docs[0]['meaning']}")
    print(f"{'target':30s} {'x run 1':>16s} {'x run 2':>16s} {'diff':>16s}  "
          f"{'within ' + format(GOAL_POINTS, 'g') + ' pt':>12s}  within 2 ±")
    for r in repeat_rows(*docs):
        def pm(x: float | None, err: float | None, sign: str = "") -> str:
            return "-" if x is None else f"{x:{sign}.3f}" + ("" if err is None
                                                            else f" ± {err:.3f}")

        scatter = {None: "-", True: "yes", False: "NO"}[r["within_scatter"]]
        print(f"{r['target']:30s} {pm(r['x1_pct'], r['x1_pm_pct']):>16s} "
              f"{pm(r['x2_pct'], r['x2_pm_pct']):>16s} "
              f"{pm(r['difference_points'], r['difference_pm_points'], '+'):>16s}  "
              f"{'yes' if r['within_goal'] else 'NO':>12s}  {scatter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
