"""A job's or pod's ±: the rule's error of the group as one unit, not its processes' in quadrature.

The rule's split is zero-sum between the processes of a GPU: what it moves between two
processes of one job stays in the job. Before, `energy --by-job` added each process's rule ±
in quadrature: a job holding every working process of the lent H200's pairs got ± 3,568 J of
25,604 J for joules no rule could move out of it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.late_reads import record_shared
from tests.process_runs import PROCS, write_shared_run
from wattlab.analysis.attribution import energy_by_process
from wattlab.analysis.attribution.by_process import ByProcess, ProcessEnergy
from wattlab.analysis.attribution.job_share import share_of_job
from wattlab.analysis.attribution.process_view import group_by
from wattlab.runfile import Run

pytestmark = pytest.mark.fast

TRACES = Path(__file__).parent / "data" / "traces"
LOADED = {"late_p": 0.3, "late_s": (0.3, 1.3)}  # as tests/test_late_reads.py


def split_of(path: Path) -> ByProcess:
    with Run(str(path)) as run:
        return energy_by_process(run)


def members(result: ByProcess, key: str, name: str) -> list[ProcessEnergy]:
    return [p for p in result.processes if (p.identity.get(key) or "") == name]


def quadrature_pm_j(ps: list[ProcessEnergy]) -> float:
    """The ± before: sampling summed, each process's rule ± in quadrature."""
    return math.hypot(sum(p.sampling_pm_j for p in ps),
                      math.sqrt(sum(p.rule_pm_j ** 2 for p in ps)))


def test_a_group_of_one_process_has_that_process_pm(tmp_path: Path) -> None:
    result = split_of(record_shared(tmp_path / "shared.h5", seed=1))
    g = result.gpus[0]
    assert g.rule_error is not None
    for p in g.processes:  # the per-process ± is the group formula's for one process
        assert g.rule_error.pm_j([p.key]) == p.rule_pm_j
    (pod,) = [grp for grp in group_by(result, "pod") if grp.name != "(no pod)"]
    (alone,) = [p for p in result.processes if p.identity.get("pod_uid") == pod.name]
    assert pod.processes == 1 and pod.pm_j == pytest.approx(alone.pm_j, rel=1e-12)


@pytest.mark.parametrize("trace", ["h200_shared-pairs2", "h200_qualify-short-2"])
def test_a_group_of_every_working_process_of_a_gpu_has_no_rule_pm(trace: str) -> None:
    """The pairs' "(no job)" holds all 16 processes (± 3,568 J before); the qualify run's
    holds its only process (± 10,550 J before, which its own row also printed)."""
    result = split_of(TRACES / f"{trace}.h5")
    (grp,) = group_by(result, "job")
    (g,) = result.gpus
    assert g.rule_error is not None
    sampling_j = sum(p.sampling_pm_j for p in result.processes)
    # the baseline's ± is not the rule's: a group of every process moves by all of it
    baseline_j = g.rule_error.baseline_j([p.key for p in result.processes])
    assert 0 < baseline_j < grp.energy_j
    assert grp.processes == len(result.processes)
    assert grp.pm_j == pytest.approx(math.hypot(sampling_j, baseline_j), rel=1e-6)
    if len(result.processes) == 1:  # a GPU's only working process: nothing to move to
        (p,) = result.processes
        assert p.rule_pm_j == pytest.approx(0, abs=1e-6)
        assert p.baseline_pm_j == pytest.approx(baseline_j, rel=1e-12)
        assert p.pm_j == pytest.approx(grp.pm_j, rel=1e-6)


def test_all_processes_in_one_job_have_the_sampling_pm_only(tmp_path: Path) -> None:
    procs = [type(q)(q.pid, q.present, q.active, q.sm, q.mem, q.identity | {"slurm_job": "9"})
             for q in PROCS]
    result = split_of(write_shared_run(tmp_path / "r.h5", procs=procs, truth=True))
    (job,) = group_by(result, "job")
    assert job.pm_j == pytest.approx(sum(p.sampling_pm_j for p in result.processes), rel=1e-6)
    truth_j = sum(p.truth_dynamic_j or 0.0 for p in result.processes)
    assert abs(job.dynamic_j - truth_j) <= job.pm_j
    assert job.pm_j < quadrature_pm_j(result.processes) / 2


@pytest.mark.parametrize(("seed", "late"), [(1, False), (2, False), (1, True), (2, True)])
def test_a_job_holding_part_of_the_gpu_has_a_pm_between_that_holds_its_truth(
        tmp_path: Path, seed: int, late: bool) -> None:
    """The demo's GPU: job 7001's two Slurm steps beside one pod. Its ± is more than its
    sampling (joules may cross to the pod) and less than its steps' in quadrature."""
    path = record_shared(tmp_path / "shared.h5", seed=seed,
                         **(LOADED if late else {}))  # type: ignore[arg-type]
    result = split_of(path)
    ps = members(result, "slurm_job", "7001")
    assert len(ps) == 2 and len(result.processes) == 3
    (job,) = [grp for grp in group_by(result, "job") if grp.name == "7001"]
    truth_j = sum(p.truth_dynamic_j or 0.0 for p in ps)
    assert sum(p.sampling_pm_j for p in ps) * 10 < job.pm_j < quadrature_pm_j(ps)
    assert abs(job.dynamic_j - truth_j) <= job.pm_j
    # each late step's unseen joules once, however many of its processes worked beside it
    err = result.gpus[0].rule_error
    assert err is not None
    late_j = err.late_j([p.key for p in ps])
    assert late_j <= sum(p.late_pm_j for p in ps) and (late_j > 0) == late
    # the Slurm job summary charges the job the same ±
    summary = share_of_job(result, "7001")["this_job"]
    assert summary["pm_j"] == job.pm_j


def test_a_group_spread_over_stretches_apart_adds_their_mispredictions_in_quadrature() -> None:
    """Two processes that worked at different times (two pairs of the lent H200's run) are
    two mispredictions of the rule: linearly their job's ± was the sum of their own."""
    (g,) = split_of(TRACES / "h200_shared-pairs2.h5").gpus
    err = g.rule_error
    assert err is not None
    spans = sorted(err.spans_s.items(), key=lambda kv: kv[1])
    (a, span_a), (b, span_b) = spans[0], next(kv for kv in spans if kv[1][0] > spans[0][1][1])
    assert span_a[1] < span_b[0]  # apart in time
    one, two, both = err.own_j([a]), err.own_j([b]), err.own_j([a, b])
    assert one > 0 and two > 0
    assert both == pytest.approx(math.hypot(one, two), rel=1e-9)
    assert both < 0.99 * (one + two)
