"""Energy per process on the simulated shared GPU recorded offline, reads on time or late.

``tests/late_reads.record_shared`` (``demo --shared``'s GPU and reader on a fake clock: the
same bytes on every machine) for each seed, once with every wake-up on time and once with a
third of them 0.3-1.3 s late (a loaded host), then ``energy_by_process``: each process's
dynamic energy against the simulator's truth, its ± (and the ± without the late reads'
part), and the dynamic energy left to "no process active". Prints a table, writes
bench/results/late_reads_sim.json. Usage:

    python bench/late_reads_sim.py [--seeds 1,2,3,4,5,6]
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.late_reads import record_shared

from common import doc_parser, write_json
from wattlab.analysis.attribution import energy_by_process
from wattlab.runfile import Run

LOADED = {"late_p": 0.3, "late_s": (0.3, 1.3)}  # as tests/test_late_reads.py


def one(path: Path, seed: int, loaded: bool) -> dict[str, Any]:
    """One run's split: each process's error against the truth, its ±, the unattributed J."""
    record_shared(path, seed=seed, **(LOADED if loaded else {}))  # type: ignore[arg-type]
    with Run(str(path)) as run:
        g = energy_by_process(run).gpus[0]
    rows = []
    for p in g.processes:
        truth = p.truth_dynamic_j or math.nan
        err = p.dynamic_j - truth
        without = math.hypot(p.sampling_pm_j, p.rule_pm_j - p.late_pm_j)
        rows.append({"process": p.label, "truth_j": truth, "err_j": err,
                     "err_pct": 100 * err / truth, "pm_j": p.pm_j, "pm_without_late_j": without})
    return {"seed": seed, "loaded": loaded, "unattributed_j": g.unattributed_j,
            "total_j": g.total_j, "processes": rows}


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("--seeds", default="1,2,3,4,5,6")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for loaded in (False, True):
            for seed in (int(s) for s in args.seeds.split(",")):
                runs.append(one(Path(tmp) / f"{seed}-{loaded}.h5", seed, loaded))
    print(f"{'reads':8} {'seed':>4}  {'no process J':>12}  each process: error % (J ± J)")
    for r in runs:
        each = "  ".join(f"{p['err_pct']:+6.1f} % ({p['err_j']:+5.0f} ± {p['pm_j']:.0f})"
                         for p in r["processes"])
        print(f"{'loaded' if r['loaded'] else 'on time':8} {r['seed']:>4}  "
              f"{r['unattributed_j']:12.0f}  {each}")
    for loaded in (False, True):
        procs = [p for r in runs if r["loaded"] == loaded for p in r["processes"]]
        rel = [abs(p["err_pct"]) for p in procs]
        print(f"{'loaded' if loaded else 'on time'}: mean |error| {sum(rel) / len(rel):.1f} %, "
              f"worst {max(rel):.1f} %; within ± {sum(abs(p['err_j']) <= p['pm_j'] for p in procs)}"
              f" of {len(procs)}, within ± without the late reads' part "
              f"{sum(abs(p['err_j']) <= p['pm_without_late_j'] for p in procs)}")
    write_json("late_reads_sim", {"seeds": args.seeds, "loaded": LOADED, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
