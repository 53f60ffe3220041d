"""`wattlab qualify --simulate`: the MLPerf meter qualification on the emulated bench.

    python bench/qualify.py            # short form: five 12 s windows a level (goal < 7 min)
    python bench/qualify.py --full     # MLPerf's five 60 s windows a level (~17 min)

The simulated H100 under idle and two loads, the emulated PowerSensor3 on its rails as the
reference, a 60 s calibration run first (the corrected NVML's calibration comes from it,
never from the scored run). Goals (issue 37): corrected NVML qualifies at <= 2 % against the
riser, uncorrected NVML is reported at what it is, the wall meter against the board is
refused. Prints a table and writes bench/results/qualify[_full].json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import GOALS_MISSED, write_json

WATTLAB = [sys.executable, "-m", "wattlab.cli"]
GOAL_S = 7 * 60
GOAL_CORRECTED_PCT = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="five 60 s windows a level")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "qualify.h5"
        form = [] if args.full else ["--short"]
        started = time.monotonic()
        done = subprocess.run([*WATTLAB, "qualify", "--simulate", *form, "--force-calibration",
                               "-o", str(out), "--json"], capture_output=True, text=True,
                              check=False)
        seconds = time.monotonic() - started
    # 1: scored, but the recording lost data (the emulated riser's frames on a busy host)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        print(done.stderr[-3000:], file=sys.stderr)
        return 1
    doc = json.loads(done.stdout)
    rows = []
    print(f"{'target':38s} {'x %':>6s} {'pass':>5s} {'valid':>5s} "
          f"{'0.1 s med/p95 %':>16s} {'1 s med/p95 %':>14s} {'10 s med/p95 %':>15s}")
    for t in doc["targets"]:
        name = t["target"] + (" corrected" if t["corrected"] else "")
        row = {"target": name, "refused": t["refused"], "x_pct": t["x_pct"],
               "passed": t["passed"], "valid": t["valid"], "fine": t["fine"],
               "invalid_windows": len(t["invalid_windows"])}
        rows.append(row)
        if t["refused"]:
            print(f"{name:38s} refused: {t['refused']}")
            continue
        fine = [f"{f['median_pct']:.2f}/{f['p95_pct']:.2f}" for f in t["fine"]]
        print(f"{name:38s} {t['x_pct']:6.2f} {t['passed']!s:>5s} {t['valid']!s:>5s} "
              f"{fine[0]:>16s} {fine[1]:>14s} {fine[2]:>15s}")
    corrected = next(r for r in rows if r["target"].endswith("corrected"))
    wall = next(r for r in rows if r["target"].startswith("wall"))
    goals = {"seconds_under_7_min": args.full or seconds < GOAL_S,
             "corrected_nvml_within_2_pct": (corrected["x_pct"] is not None
                                             and corrected["x_pct"] <= GOAL_CORRECTED_PCT),
             "wall_against_board_refused": bool(wall["refused"])}
    print(f"{seconds:.0f} s end to end; goals: {goals}")
    print(f"calibration warnings: {doc['calibration_warnings']}; exit status "
          f"{done.returncode}")
    path = write_json("qualify_full" if args.full else "qualify",
                      {"form": doc["form"], "window_s": doc["window_s"], "seconds": seconds,
                       "exit_status": done.returncode,
                       "calibration_warnings": doc["calibration_warnings"], "rows": rows,
                       "goals": goals})
    print(f"wrote {path}")
    return 0 if all(goals.values()) else GOALS_MISSED


if __name__ == "__main__":
    sys.exit(main())
