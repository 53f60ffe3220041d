"""gpu0.processes on a real NVIDIA GPU (opt-in: WATTLAB_DEVICE=1; needs torch). Read-only.

Records `wattlab record --nvml 0` around a CUDA process (bf16 matrix products for ~6 s) that
writes its pid to a file, and checks what docs/processes.md promises: rows of that pid with
SM utilisation above 0, and its `process` marker with its command name, start time and pid
(where wattlab runs in a container with its own /proc: busy rows, and processes "unknown").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import wattlab
from wattlab.acquisition.acquirers.process_identity import host_view

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(os.environ.get("WATTLAB_DEVICE") != "1",
                       reason="needs a real NVIDIA GPU: set WATTLAB_DEVICE=1"),
]

WORKLOAD = """
import os, sys, time, torch
open(sys.argv[1], "w").write(str(os.getpid()))
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + 6.0
while time.monotonic() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""


def test_a_cuda_process_has_rows_and_an_identity(tmp_path):
    pytest.importorskip("torch")
    out = Path(os.environ.get("OUT") or tmp_path)
    path, pid_file = out / "device_processes.h5", tmp_path / "pid"
    cmd = [sys.executable, "-m", "wattlab.cli", "record", "--nvml", "0", "-o", str(path),
           "--", sys.executable, "-c", WORKLOAD, str(pid_file)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr
    pid = int(pid_file.read_text())
    if not host_view():  # wattlab in a container with its own /proc: NVML's pids are the
        with wattlab.open(str(path)) as run:  # host's, so the process must be "unknown"
            busy = run.source("gpu0.processes").channel("sm_util_pct")
            identities = [m.payload for m in run.markers if m.name == "process"]
        assert (busy > 0).any() and identities
        assert all(p["local_pid"] is None and p["comm"] is None for p in identities)
        return
    with wattlab.open(str(path)) as run:
        assert "gpu0.processes" in run.sources, run.source("gpu0.samples").descriptor[
            "config"]["missing"]
        stream = run.source("gpu0.processes")
        pids, sm = stream.channel("pid"), stream.channel("sm_util_pct")
        raw_us = stream.time_raw
        markers = [m for m in run.markers if m.name == "process" and m.payload["pid"] == pid]
    mine = pids == pid
    assert mine.sum() >= 10 and (sm[mine] > 0).any(), (np.unique(pids), sm[mine])
    assert np.all(np.diff(raw_us[mine]) > 0)  # no sample twice
    (marker,) = markers
    assert marker.source == "gpu0.processes"
    assert marker.payload["comm"].startswith("python"), marker.payload
    assert marker.payload["local_pid"] == pid and marker.payload["start_ticks"] is not None
    print({k: marker.payload[k] for k in ("comm", "user", "cgroup", "container_id",
                                          "pod_uid", "slurm_job")})
