#!/usr/bin/env python3
"""A fresh clone's `.ci/run`, timed, optionally beside CPU burners; each run appended to a log.

    python bench/suite_runs.py [--burners 2] [--repo PATH]

Why: the test suite's goals (issue 34) are a wall time with the install on the 2-core
machine and zero failures in five consecutive runs beside two CPU-burning processes. Both
are properties of a fresh clone as CI makes it, so this bench clones the repository's HEAD
into a temporary folder, runs `.ci/run` there with CI=true and no standard input, and
appends {commit, burners, seconds, exit status, pytest's closing line, slowest tests} to
`suite_runs.json` (a log over days: the five may be spread out), the whole output beside
it. The slowest tests come
from the `--durations=25` the suite always prints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, machine

HERE = Path(__file__).resolve().parent
BURN = "while True: pass"
MOST_BURNERS = 16  # the goal's load is 2; more only starves the run being measured
_SUMMARY = re.compile(r"^=+ (.*(?:passed|failed).*) in [0-9.]+s", re.M)
_DURATION = re.compile(r"^([0-9.]+)s (call|setup|teardown)\s+(\S+)", re.M)


def run_once(repo: Path, burners: int) -> dict[str, Any]:
    """Clone, start the burners, run .ci/run, stop the burners; what happened."""
    with tempfile.TemporaryDirectory(prefix="suite-") as folder:
        clone = Path(folder) / "wattlab"
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, check=True,
                                capture_output=True, text=True).stdout.strip()
        burning = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(burners)]
        started = time.monotonic()
        try:
            done = subprocess.run(["bash", ".ci/run"], cwd=clone, capture_output=True,
                                  text=True, stdin=subprocess.DEVNULL, check=False,
                                  env={**os.environ, "CI": "true"})
        finally:
            for p in burning:
                p.kill()
                p.wait()
        seconds = time.monotonic() - started
    out = done.stdout + done.stderr
    summary = _SUMMARY.findall(out)
    slowest = [{"s": float(s), "when": when, "test": test}
               for s, when, test in _DURATION.findall(out)][:25]
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = RESULTS / f"suite_run_{commit}_{time.strftime('%Y%m%dT%H%M%S')}.log"
    log.write_text(out)  # the failures' reasons: a run under load is too dear to repeat
    return {**machine(), "commit": commit, "burners": burners, "seconds": round(seconds, 1),
            "exit": done.returncode, "summary": summary[-1] if summary else "",
            "failed": re.findall(r"^FAILED (\S+)", out, re.M), "slowest": slowest,
            "log": str(log)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burners", type=int, default=0, help="CPU-burning processes beside it")
    ap.add_argument("--repo", type=Path, default=HERE.parent, help="repository to clone")
    args = ap.parse_args()
    if not 0 <= args.burners <= MOST_BURNERS:
        ap.error(f"--burners must be 0 to {MOST_BURNERS}")
    if not (args.repo / ".git").exists():
        ap.error(f"--repo {args.repo}: not a git checkout")
    row = run_once(args.repo, args.burners)
    log = RESULTS / "suite_runs.json"
    runs = json.loads(log.read_text()) if log.exists() else []
    runs.append(row)
    log.write_text(json.dumps(runs, indent=1) + "\n")
    print("commit   burners  seconds  exit  result")
    for r in runs:
        print(f"{r['commit']:<8} {r['burners']:>7} {r['seconds']:>8.0f} {r['exit']:>5}  "
              f"{r['summary']}")
    print(f"log: {log}")
    return 0 if row["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
