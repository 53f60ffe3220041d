"""Per-pod and per-job energy counters of a real recording, scraped over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from typing import Any

import h5py
import numpy as np
import pynvml
import pytest

from tests.conftest import free_port
from tests.test_prometheus import WATTLAB, Samples, pick, scrape, scrape_while
from wattlab.acquisition.acquirers import NvmlAcquirer
from wattlab.acquisition.session import Session
from wattlab.drivers.nvml import NvmlDriver
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import simulated_gpus
from wattlab.sync.recorder.live_energy.process_series import GRACE_ENV

pytest.importorskip("prometheus_client.parser",
                    reason="prometheus-client is not installed (the prometheus extra)")

GROUPS = ("wattlab_gpu_pod_energy_joules_total", "wattlab_gpu_job_energy_joules_total")


def group_series(samples: Samples) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in samples.items() if k[0] in GROUPS}


def simulated_truth(path: str) -> dict[str, float]:
    with h5py.File(path) as f:
        rows = [r for r in f["markers"][:] if r["name"] == b"simulated-truth"]
    return {k: float(v) for k, v in json.loads(rows[0]["payload"])["dynamic_j"].items()}


def scrape_session(session: Session, port: int) -> list[Samples]:
    """Runs ``session`` (its exporter on ``port``), scraping it every 0.3 s until it ends."""
    done: list[Any] = []
    runner = threading.Thread(target=lambda: done.append(session.run()))
    runner.start()
    scrapes: list[Samples] = []
    while runner.is_alive():
        with contextlib.suppress(OSError):
            scrapes.append(scrape(f"http://127.0.0.1:{port}/metrics"))
        runner.join(0.3)
    assert done, "the session did not finish"
    return scrapes


@pytest.mark.system
def test_pods_and_jobs_of_a_shared_gpu_get_counters_that_end_with_them(tmp_path, spawn):
    out = tmp_path / "shared.h5"
    port = free_port()
    # the simulated processes leave by 32 s; a 4 s grace drops their series before the end
    proc = spawn([*WATTLAB, "record", "--simulate", "--shared-processes", "3", "--duration",
                  "40", "-o", str(out), "--no-live", "--prometheus", str(port)],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env={**os.environ, GRACE_ENV: "4"})
    scrapes = scrape_while(proc, f"http://127.0.0.1:{port}/metrics", every_s=0.5)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    seen = [s for s in scrapes if group_series(s)]
    assert seen, "no pod or job series appeared"
    # two simulated Slurm steps of one job and one pod: two series, never one per pid
    keys = {k for s in seen for k in group_series(s)}
    assert {(k[0], dict(k[1]).get("slurm_job") or dict(k[1])["pod_uid"]) for k in keys} == {
        (GROUPS[1], "7001"), (GROUPS[0], "00000001-0000-4000-8000-000000000001")}
    for key in keys:  # counters: they only grow, and they grew
        values = [s[key] for s in seen if key in s]
        assert np.all(np.diff(values) >= 0) and values[-1] > 100, (key, values)
    for s in seen:  # never more than the GPU's energy; idle is known before any joule
        assert sum(group_series(s).values()) <= pick(
            s, "wattlab_energy_joules_total", source="gpu0.samples", channel="power_w")
        if sum(group_series(s).values()) > 0:
            assert pick(s, "wattlab_gpu_idle_watts", gpu="gpu0") == pytest.approx(70, abs=3)
    # idle and static are not charged: the pods and jobs share the dynamic energy
    final_j = sum(max(s.get(k, 0.0) for s in seen) for k in keys)
    assert final_j == pytest.approx(sum(simulated_truth(str(out)).values()), rel=0.1)
    # the series are dropped after their processes left (and the grace): the last scrapes
    # of the recording have none
    assert scrapes[-1] and not group_series(scrapes[-1])
    assert pick(scrapes[-1], "wattlab_gpu_process_series_refused_total") == 0
    # exported (a loaded machine may deliver some rows late: counted, not a failure)
    assert pick(scrapes[-1], "wattlab_gpu_process_rows_late_total", gpu="gpu0") >= 0


@pytest.mark.system
def test_a_gpu_refusing_the_process_query_says_why_and_has_no_pod_series(tmp_path):
    lib = FakeNvml(simulated_gpus(1, 3), process_query_error=pynvml.NVML_ERROR_NO_PERMISSION)
    port = free_port()
    session = Session(str(tmp_path / "refused.h5"), [("gpu0", NvmlAcquirer(NvmlDriver(lib), 0))],
                      duration_s=3.0, recorder_options={"prometheus": str(port)})
    scrapes = scrape_session(session, port)
    described = [s for s in scrapes if any(k[0] == "wattlab_gpu_processes_missing" for k in s)]
    assert described, "no scrape said why the GPU has no per-process stream"
    assert pick(described[-1], "wattlab_gpu_processes_missing", gpu="gpu0",
                reason="Insufficient Permissions") == 1
    assert not any(group_series(s) for s in scrapes)
