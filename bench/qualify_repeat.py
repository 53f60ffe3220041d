"""Two `wattlab qualify --json` results of one GPU side by side: does x repeat?

    python bench/qualify_repeat.py FIRST.json SECOND.json

Per target: x % of each run and their difference in points; the goal (issue 37) is a repeat
within ``GOAL_POINTS``. Used by bench/device_qualify_37.sh on the lent GPU, where the two
runs are separate commands. Exit 0 whether the goal is met or not: the numbers are the
finding; exit 2 on a result that cannot be compared.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GOAL_POINTS = 0.2


def repeat_rows(first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, Any]]:
    """Per target scored in both: its x in each and the difference (None where unscored)."""
    def scores(doc: dict[str, Any]) -> dict[str, float | None]:
        return {t["target"] + (" corrected" if t["corrected"] else ""): t["x_pct"]
                for t in doc["targets"] if not t["refused"]}

    a, b = scores(first), scores(second)
    rows = []
    for name in [n for n in a if n in b]:
        x1, x2 = a[name], b[name]
        diff = None if x1 is None or x2 is None else x2 - x1
        rows.append({"target": name, "x1_pct": x1, "x2_pct": x2, "difference_points": diff,
                     "within_goal": diff is not None and abs(diff) <= GOAL_POINTS})
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
    print(f"{'target':34s} {'x run 1':>9s} {'x run 2':>9s} {'diff':>8s}  within "
          f"{GOAL_POINTS:g} points")
    for r in repeat_rows(*docs):
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f} %"

        diff = "-" if r["difference_points"] is None else f"{r['difference_points']:+.3f}"
        print(f"{r['target']:34s} {pct(r['x1_pct']):>9s} {pct(r['x2_pct']):>9s} {diff:>8s}  "
              f"{'yes' if r['within_goal'] else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
