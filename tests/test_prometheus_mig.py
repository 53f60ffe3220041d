"""Live per-pod and per-job energy of a MIG GPU (issue 41): each instance's share of the
GPU's energy, charged to the pod and job of the processes in it, scraped over HTTP from a
real recording of the simulated MIG H100 and checked against ``energy --by-pod/--by-job``
of the same run file."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest

from tests.conftest import free_port
from tests.test_prometheus import Samples, pick
from tests.test_prometheus_processes import GROUPS, group_series, scrape_session
from wattlab.acquisition.acquirers import NvmlAcquirer
from wattlab.acquisition.session import Session
from wattlab.cli import main
from wattlab.drivers.nvml import NvmlDriver
from wattlab.hardware.shared_fake_nvml import SharedFakeNvml
from wattlab.hardware.shared_gpu import IDLE_LEAD_S, MigLoad, mig_simulated_gpu
from wattlab.hardware.simulated_gpu import SimulatedGpu
from wattlab.samples import Channel, Marker, SourceDescriptor
from wattlab.sync.recorder.live_energy import LiveProcessEnergy

pytest.importorskip("prometheus_client.parser",
                    reason="prometheus-client is not installed (the prometheus extra)")

S = 1_000_000_000
PROFILES = ["3g.40gb", "2g.20gb", "2g.20gb"]
SPAN_S = 20.0  # its contexts idle together over 2.4 s: a whole window shows static
POD = "00000001-0000-4000-8000-000000000001"
SHARED = "wattlab_gpu_instance_shared_energy_joules_total"
# The live split is Kepler's rule over 1 s windows; the run file's, over each GPM read step
# (0.09 s) and with its own idle and static. The dynamic energy of all instances is the
# same either way (measured: within 0.7 %); how Kepler's rule shares it among instances
# moves with the step and with where the 1 s windows fall (measured over three recordings:
# job 7001 +3 to +4 %, the pod -9 to -14 %, against --rule utilisation; against the
# default activity rule, which is nearer the truth, +13 to +14 % and -34 to -38 %).
TOTAL_REL = 0.02
GROUP_REL = 0.25


def record_live(tmp_path: Any, move: dict[int, int] | None = None) -> tuple[str, list[Samples]]:
    """A real recording of the simulated MIG H100, scraped every 0.3 s while it runs.

    ``move``: pid -> GPU instance, processes put in another instance than the demo's.
    The recording outlasts the processes by 6 s: every window they worked in is settled.
    The GPU's clock starts at the reader's first read (``SharedFakeNvml``): started when
    made, its 3 s idle lead passed while a loaded machine started the session (five busy
    processes on two cores), idle was never seen, and every live counter stayed at 0 J.
    """
    def make(start_ns: int) -> list[SimulatedGpu]:
        gpu = mig_simulated_gpu(PROFILES, 2, SPAN_S, start_ns=start_ns)
        assert isinstance(gpu.processes, MigLoad)
        gpu.processes.instance_of.update(move or {})
        return [gpu]

    out, port = str(tmp_path / "mig.h5"), free_port()
    lib = SharedFakeNvml(make, time.monotonic_ns)
    session = Session(out, [("gpu0", NvmlAcquirer(NvmlDriver(lib), 0))],
                      duration_s=IDLE_LEAD_S + SPAN_S + 6.0,
                      recorder_options={"prometheus": str(port)})
    return out, [s for s in scrape_session(session, port) if s]


def final(scrapes: list[Samples]) -> dict[str, float]:
    """Each pod's and job's last value, by its pod uid or job id."""
    out: dict[str, float] = {}
    for s in scrapes:
        for (name, labels), value in group_series(s).items():
            key = dict(labels)["slurm_job" if name == GROUPS[1] else "pod_uid"]
            out[key] = max(out.get(key, 0.0), value)
    return out


def shared_of(samples: Samples) -> dict[tuple[str, str], float]:
    """The instances' energy charged to no pod or job: (gi, owner) -> J."""
    return {(dict(ls)["gi"], dict(ls)["owner"]): v for (n, ls), v in samples.items()
            if n == SHARED}


def after_the_run(path: str, capsys: Any, *rule: str) -> dict[str, float]:
    """``energy --by-job`` and ``--by-pod``: each group's energy, by job id or pod uid."""
    out: dict[str, float] = {}
    for flag in ("--by-job", "--by-pod"):
        assert main(["energy", path, flag, "--json", *rule]) == 0
        for row in json.loads(capsys.readouterr().out)["groups"]["rows"]:
            out[row["name"]] = row["energy_j"]
    return out


@pytest.mark.system
def test_a_live_mig_recording_charges_pods_and_jobs_as_energy_by_job_does(tmp_path, capsys):
    path, scrapes = record_live(tmp_path)
    live = final(scrapes)
    assert set(live) == {"7001", POD}  # job 7001's two instances are one series
    same_rule = after_the_run(path, capsys, "--rule", "utilisation")
    activity = after_the_run(path, capsys)
    print("live", live, "utilisation rule", same_rule, "activity rule", activity)
    for after in (same_rule, activity):  # every instance has one owner: all is charged
        assert sum(live.values()) == pytest.approx(after["7001"] + after[POD], rel=TOTAL_REL)
    for key, value in live.items():
        assert value > 100
        assert value == pytest.approx(same_rule[key], rel=GROUP_REL), (key, live, same_rule)
    last = scrapes[-1]
    assert not any(k[0] == SHARED for k in last)  # one owner per instance: nothing shared
    # a MIG GPU has no per-process stream, yet its pods and jobs are charged: not "missing"
    assert not any(k[0] == "wattlab_gpu_processes_missing" for k in last)
    assert pick(last, "wattlab_gpu_idle_watts", gpu="gpu0") == pytest.approx(70, abs=3)
    for key in {k for s in scrapes for k in group_series(s)}:  # counters: they only grow
        values = [s[key] for s in scrapes if key in s]
        assert np.all(np.diff(values) >= 0), (key, values)


@pytest.mark.system
def test_an_instance_holding_a_pod_and_a_job_is_charged_to_neither(tmp_path, capsys):
    # job 7001's second process (pid 4174) runs in the pod's instance (gi2); gi3 is empty
    path, scrapes = record_live(tmp_path, move={4174: 2})
    live = final(scrapes)
    after = after_the_run(path, capsys, "--rule", "utilisation")
    print("live", live, "shared", shared_of(scrapes[-1]), "after the run", after)
    assert live[POD] == 0.0 and POD not in after  # the pod's only instance was shared
    assert live["7001"] == pytest.approx(after["7001"], rel=GROUP_REL)  # gi1 alone
    shared = shared_of(scrapes[-1])
    assert set(shared) == {("2", "pod"), ("2", "job")}, shared
    # what neither got is the instance's energy, as after the run's (no job) row
    assert shared[("2", "job")] == shared[("2", "pod")] > 100
    assert shared[("2", "job")] == pytest.approx(after["(no job)"], rel=GROUP_REL)
    assert live["7001"] + shared[("2", "job")] == pytest.approx(
        after["7001"] + after["(no job)"], rel=TOTAL_REL)


def mig_energy() -> LiveProcessEnergy:
    live = LiveProcessEnergy()
    live.describe(SourceDescriptor("gpu0.samples", "nvml", "Simulated H100",
                                   (Channel("power_w", "W"),),
                                   config={"missing": {"processes": "Not Supported"}}))
    live.describe(SourceDescriptor(
        "gpu0.mig", "nvml-mig", "Simulated H100",
        (Channel("gi", "1"), Channel("sm_util_pct", "%"), Channel("dram_bw_util_pct", "%"),
         Channel("processes", "1")),
        config={"instances": [{"gi": 1, "sm_count": 60}, {"gi": 2, "sm_count": 60}]}))
    return live


def arrive(t_s: float, pid: int, gi: int, **identity: str) -> Marker:
    return Marker(int(t_s * S), "process", "point", "gpu0.mig",
                  {"gpu": 0, "pid": pid, "gi": gi, **identity})


def leave(t_s: float, pid: int) -> Marker:
    return Marker(int(t_s * S), "process-exit", "point", "gpu0.mig", {"gpu": 0, "pid": pid})


def feed(live: LiveProcessEnergy, until_s: int, sm: dict[int, float]) -> None:
    """70 W idle, 170 W from 3 s; 0.1 s MIG rows of ``sm`` (gi -> SM %) from 3 s."""
    for start in range(0, until_s * S, S // 2):
        t = np.arange(start, start + S // 2, S // 50, dtype=np.int64)
        rows_t = np.arange(max(start, 3 * S), start + S // 2, S // 10, dtype=np.int64)
        rows = [[gi, pct, 0.0, 1.0] for _ in rows_t for gi, pct in sm.items()]
        if rows:
            live.add_rows("gpu0.mig", np.repeat(rows_t, len(sm)), np.array(rows))
        live.add_rows("gpu0.samples", t, np.where(t < 3 * S, 70.0, 170.0)[:, None])


@pytest.mark.fast
def test_instance_joules_go_to_its_one_owner_and_a_shared_one_to_nobody():
    live = mig_energy()
    live.add_markers([arrive(3, 11, 1, slurm_job="1"), arrive(3, 12, 1, slurm_job="1"),
                      arrive(3, 21, 2, slurm_job="2", pod_uid="u"),
                      arrive(3, 22, 2, slurm_job="3", pod_uid="u")])
    feed(live, 20, {1: 30.0, 2: 10.0})
    got = live.figures(0)
    jobs = {labels["slurm_job"]: j for labels, j in got.jobs}
    pods = {labels["pod_uid"]: j for labels, j in got.pods}
    # 100 W above idle from 3 s, windows to 16 s settled; gi1 has 3/4 of the SM share
    assert jobs["1"] == pytest.approx(0.75 * 100 * 13, rel=0.01)
    assert jobs["2"] == jobs["3"] == 0.0  # two jobs in gi2: neither is charged
    assert pods["u"] == pytest.approx(0.25 * 100 * 13, rel=0.01)  # one pod there
    assert got.shared_j == {("gpu0", 2, "job"): pytest.approx(pods["u"])}
    assert got.missing == {} and got.idle_w["gpu0"] == pytest.approx(70.0, abs=0.5)


@pytest.mark.fast
def test_a_stretch_keeps_its_owners_until_the_instance_is_empty():
    live = mig_energy()
    # job 2 joins gi1 while job 1 is there: from then on gi1 is shared; after both left,
    # job 3 alone starts a new stretch and is charged again
    live.add_markers([arrive(3, 11, 1, slurm_job="1"), arrive(8, 12, 1, slurm_job="2"),
                      leave(10, 11), leave(11, 12), arrive(11.5, 13, 1, slurm_job="3")])
    feed(live, 20, {1: 50.0})
    got = live.figures(0)
    jobs = {labels["slurm_job"]: j for labels, j in got.jobs}
    assert jobs["1"] == pytest.approx(100 * 5, rel=0.01)  # 3-8 s: its own
    assert jobs["2"] == 0.0
    # 8-11 s; the window 11-12 s is charged by the owners at its end: job 3's
    assert got.shared_j[("gpu0", 1, "job")] == pytest.approx(100 * 3, rel=0.01)
    assert jobs["3"] == pytest.approx(100 * 5, rel=0.01)  # to 16 s, the last settled


@pytest.mark.fast
def test_an_instance_with_no_process_charges_nobody():
    live = mig_energy()
    live.add_markers([arrive(3, 11, 1, slurm_job="1")])
    feed(live, 20, {1: 40.0, 2: 40.0})  # gi2 busy with no process seen: no owner
    got = live.figures(0)
    jobs = {labels["slurm_job"]: j for labels, j in got.jobs}
    assert jobs["1"] == pytest.approx(0.5 * 100 * 13, rel=0.01) and got.shared_j == {}
