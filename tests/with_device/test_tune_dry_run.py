"""`wattlab tune --dry-run` on a real GPU during a real training job (opt-in: WATTLAB_DEVICE=1).

Read-only on the card: the tuner only measures. Checks that it found the job's iterations
in the 50 Hz power samples, that its energy per iteration is within 5 % of the one the
job's own step markers give (issue 19's goal), and that nothing was changed.

    WATTLAB_DEVICE=1 python -m pytest -q tests/with_device/test_tune_dry_run.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from wattlab.runfile.reader import Run
from wattlab.runfile.tuning_record import read_tuning

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(os.environ.get("WATTLAB_DEVICE") != "1",
                       reason="needs a real NVIDIA GPU: set WATTLAB_DEVICE=1"),
]

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("source", [[], ["--step-marker", "truth_step"]],
                         ids=["power", "markers"])
def test_dry_run_measures_a_training_job_and_changes_nothing(tmp_path, source):
    out = os.environ.get("OUT")
    path = (Path(out) if out else tmp_path) / f"tune_dry_run_{len(source)}.h5"
    before = subprocess.run(["nvidia-smi", "--query-gpu=power.limit,clocks.sm",
                             "--format=csv,noheader"], capture_output=True, text=True).stdout
    cmd = [sys.executable, "-m", "wattlab.cli", "tune", "--dry-run", "--gpu", "0",
           "-o", str(path), *source, "--", sys.executable, str(HERE / "training_jobs.py"),
           "torch-long", "--steps", "120"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=500, check=False)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr
    assert "dry run:" in result.stdout
    record = read_tuning(str(path))
    assert record is not None and record.summary["dry_run"]
    energy_j = record.summary["baseline"][0]
    with h5py.File(path) as f:
        wall_s = (f.attrs["session_end_monotonic_ns"] - f.attrs["session_start_monotonic_ns"]) / 1e9
    cpu_pct = 100 * record.summary["controller_cpu_s"] / wall_s
    print(json.dumps({"controller_cpu_pct_of_a_core": cpu_pct}))
    assert cpu_pct < 1.0  # the controller's own CPU: iteration detection, search
    it = record.iterations
    counted = it.used & (it.probe == 0)
    assert counted.sum() >= 10
    # the default's measurement: its iterations' span, on the session timebase
    span_ns = (int(it.start_ns[counted][1]), int(it.end_ns[counted][-1]))
    with Run(str(path)) as run:
        steps = [m for m in run.markers if m.name == "truth_step"]
        energy = run.source("gpu0.samples")
        begins = [m.time_ns for m in steps if m.kind == "begin"]
        t = energy.time_ns
        p = energy.channel("power_w").astype(np.float64)
    assert len(begins) > 10
    # markers: energy from one step's start to the next, from the same samples, over the
    # steps the tuner measured (it drops the first iteration at a setting)
    cum = np.concatenate([[0.0], np.cumsum(np.diff(t) / 1e9 * p[:-1])])
    inside = [b for b in begins if span_ns[0] - 50_000_000 <= b <= span_ns[1] + 50_000_000]
    per_step = np.diff(np.interp(inside, t, cum))
    marker_j = float(np.mean(per_step))
    print(json.dumps({"tune_j": energy_j, "markers_j": marker_j}))
    assert abs(energy_j / marker_j - 1) < 0.05
    after = subprocess.run(["nvidia-smi", "--query-gpu=power.limit,clocks.sm",
                            "--format=csv,noheader"], capture_output=True, text=True).stdout
    assert before.split(",")[0] == after.split(",")[0]
