"""The validity verdict over every run the project ships: which figures fail, and why.

Issue 37 asks that, once the checks are fixed, the demo and every trace in tests/data are
checked, and that a failing figure be reported as a finding about the data, not met by
moving a threshold. This runs ``wattlab energy --by-marker --json`` on every golden case
(``tests.golden.cases``: the seeded simulated runs, the demo, the imported H100 capture and
every trace in tests/data/traces) and counts, per run, the figures marked invalid and the
checks that failed, with the first failing reason of each check. Prints a table, writes
bench/results/validity_survey.json. Usage:

    python bench/validity_survey.py [CASE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.golden import Case, cases, run_cli_in_process

from common import write_json


def by_marker(case: Case, scratch: Path) -> dict[str, Any]:
    """``energy --by-marker --json`` on the case's run, in this process (as the golden does)."""
    argv = case.commands(str(case.make(scratch)))["energy_by_marker"]
    code, stdout, stderr = run_cli_in_process(argv)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {code}: {stderr}")
    doc: dict[str, Any] = json.loads(stdout)
    return doc


def survey(case: Case, scratch: Path) -> dict[str, Any]:
    """One run's figures: how many, how many invalid, each failing check's count and reason."""
    rows = by_marker(case, scratch)["rows"]
    failed: Counter[str] = Counter()
    first: dict[str, str] = {}
    for row in rows:
        for name, check in row["checks"].items():
            if check["applies"] and not check["ok"]:
                failed[name] += 1
                first.setdefault(name, f"{row['phase']}, {row['source']}: {check['reason']}")
    invalid = sum(not row["valid"] for row in rows)
    return {"case": case.name, "figures": len(rows), "invalid": invalid,
            "failed_checks": dict(failed), "first_reason": first}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", help="golden case names (default: every case)")
    args = parser.parse_args()
    chosen = [c for c in cases() if not args.cases or c.name in args.cases]
    unknown = set(args.cases) - {c.name for c in chosen}
    if unknown:
        parser.error(f"no golden case named {', '.join(sorted(unknown))}")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for case in chosen:
            results.append(survey(case, Path(scratch)))
    print("| run | invalid figures | failed checks |")
    print("|---|---|---|")
    for r in results:
        checks = ", ".join(f"`{k}` {n}" for k, n in sorted(r["failed_checks"].items())) or "-"
        print(f"| `{r['case']}` | {r['invalid']} of {r['figures']} | {checks} |")
    for r in results:
        for name, reason in sorted(r["first_reason"].items()):
            print(f"{r['case']}: {name}: {reason}")
    total = sum(r["invalid"] for r in results)
    print(f"{total} invalid of {sum(r['figures'] for r in results)} figures in "
          f"{len(results)} runs; {sum(1 for r in results if r['invalid'])} runs hold one")
    path = write_json("validity_survey", {"runs": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
