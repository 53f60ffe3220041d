"""A job's and a pod's ± on the simulated shared GPUs, against their truth (issue 41).

``energy --by-job``/``--by-pod``'s ± (``group_by``) against the one it replaced, each
process's rule ± in quadrature and sampling summed (``quadrature``), for every run whose
processes carry a Slurm job or a pod and whose truth is known: ``demo --shared``'s GPU
recorded offline (``tests/late_reads.record_shared``: two Slurm steps of job 7001 and one
pod), each seed on time and with a third of the reads late, and ``tests/process_runs``'
run (jobs 4711 and 4712, pod ``pod-a``). A group's truth is its processes' true dynamic
energy. Each TRACE given (a recording without jobs or pods) adds its "(no job)" group: every
process of its GPU, no truth; where TRACE is a ``shared_gpu.py pairs`` recording, also a job
per workload holding that workload's processes of every pair, with the exclusive runs'
truth (``workload_jobs``). Prints a table, writes bench/results/group_pm41.json. Usage:

    python bench/group_pm41.py [--seeds 1,2,3] [TRACE ...]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.late_reads import record_shared
from tests.process_runs import write_shared_run

from common import write_json
from shared_gpu_truth import SharedRun, exclusive_j, pairs_of
from wattlab.analysis.attribution import energy_by_process
from wattlab.analysis.attribution.by_process import ByProcess, ProcessEnergy
from wattlab.analysis.attribution.process_view import GROUPS, group_by
from wattlab.runfile import Run

LOADED = {"late_p": 0.3, "late_s": (0.3, 1.3)}  # as bench/late_reads_sim.py


def quadrature_pm_j(ps: list[ProcessEnergy]) -> float:
    """The group ± before: sampling summed, each process's rule ± in quadrature."""
    return math.hypot(sum(p.sampling_pm_j for p in ps), math.sqrt(sum(p.rule_pm_j ** 2
                                                                      for p in ps)))


def rows(name: str, result: ByProcess) -> list[dict[str, Any]]:
    """Each job's and pod's figure, truth, ± before and after, and whether truth is within."""
    out = []
    for by in ("job", "pod"):
        key, none = GROUPS[by] or ("", "")
        for grp in group_by(result, by):
            ps = [p for p in result.processes if (p.identity.get(key) or none) == grp.name]
            truths = [p.truth_dynamic_j for p in ps]
            truth = None if None in truths else sum(t or 0.0 for t in truths)
            before = quadrature_pm_j(ps)
            out.append({"run": name, "by": by, "group": grp.name, "processes": grp.processes,
                        "dynamic_j": grp.dynamic_j, "truth_j": truth, "pm_before_j": before,
                        "pm_after_j": grp.pm_j,
                        "within_before": None if truth is None
                        else abs(grp.dynamic_j - truth) <= before,
                        "within_after": None if truth is None
                        else abs(grp.dynamic_j - truth) <= grp.pm_j})
    return out


def split(path: Path) -> ByProcess:
    with Run(str(path)) as run:
        return energy_by_process(run)


def workload_jobs(path: Path) -> ByProcess:
    """A real pairs trace split whole, each process run in a pair put in a job named by its
    workload, with its truth: its exclusive share (``shared_gpu_truth``) of the dynamic
    energy the split gave the pair. Each job then holds one workload's processes from
    several pairs, beside other processes: a group that is not the whole GPU, on real data."""
    result = split(path)
    shared = SharedRun(str(path))
    by_key = {p.key: p for p in result.processes}
    key = (GROUPS["job"] or ("", ""))[0]
    for _, pair in pairs_of(shared, exclusive_j(shared)):
        ps = [by_key[k] for w in pair.works if (k := f"gpu0:{w.payload['pid']}") in by_key]
        if len(ps) != len(pair.works):  # a run recorded before the per-process stream
            continue
        pair_j = sum(p.dynamic_j for p in ps)
        for p, name, share in zip(ps, pair.names, pair.truth, strict=True):
            p.identity = p.identity | {key: name}
            p.truth_dynamic_j = float(share * pair_j)
    return result


def seed_list(text: str) -> list[int]:
    """``--seeds 1,2,3``: whole numbers, or a usage error naming the bad one."""
    try:
        return [int(s) for s in text.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of whole numbers") from e


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3", type=seed_list)
    parser.add_argument("traces", nargs="*")
    args = parser.parse_args(argv)
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for loaded in (False, True):
                path = Path(tmp) / f"shared-{seed}-{loaded}.h5"
                record_shared(path, seed=seed, **(LOADED if loaded else {}))  # type: ignore[arg-type]
                out += rows(f"demo seed {seed}{' late' if loaded else ''}", split(path))
        out += rows("process_runs", split(write_shared_run(Path(tmp) / "runs.h5", truth=True)))
    for trace in args.traces:
        out += [r for r in rows(Path(trace).stem, split(Path(trace))) if r["by"] == "job"]
        out += [r for r in rows(f"{Path(trace).stem} jobs", workload_jobs(Path(trace)))
                if r["by"] == "job" and r["truth_j"] is not None]
    print(f"{'run':<18} {'group':<30} {'n':>2} {'dynamic J':>10} {'truth J':>10} "
          f"{'± before':>9} {'± after':>9} within before/after")
    for r in out:
        t = "-" if r["truth_j"] is None else f"{r['truth_j']:10.1f}"
        print(f"{r['run']:<18} {r['by'] + ' ' + str(r['group']):<30.30} {r['processes']:2d} "
              f"{r['dynamic_j']:10.1f} {t:>10} {r['pm_before_j']:9.1f} {r['pm_after_j']:9.1f} "
              f"{r['within_before']}/{r['within_after']}")
    write_json("group_pm41", {"rows": out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
