"""The whole record path on a real NVIDIA GPU (opt-in: WATTLAB_DEVICE=1). Read-only on the card.

Records `wattlab record --nvml 0 -- python matmul_load.py`, with every NVML stream, with
`--nvml-streams samples,energy` (one wake-up a second) and with that plus
`--nvml-intervals` FRUGAL_INTERVALS (the least CPU), and checks what issue 2 asks:
~50 samples/s from the driver's buffer, none duplicated or missing, and the samples'
integral agreeing with the energy counter within 2 %.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import wattlab
from wattlab.acquisition.acquirers.nvml_cadence import FRUGAL_INTERVALS

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(os.environ.get("WATTLAB_DEVICE") != "1",
                       reason="needs a real NVIDIA GPU: set WATTLAB_DEVICE=1"),
]

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module", params=[("all", "all", ""), ("lean", "samples,energy", ""),
                                        ("frugal", "samples,energy", FRUGAL_INTERVALS)],
                ids=lambda param: param[0])
def recorded_run(request, tmp_path_factory):
    out = os.environ.get("OUT")
    folder = Path(out) if out else tmp_path_factory.mktemp("device")
    name, streams, intervals = request.param
    path = folder / f"device_run_{name}.h5"
    cmd = [sys.executable, "-m", "wattlab.cli", "record", "--nvml", "0", "-o", str(path),
           "--nvml-streams", streams, "--nvml-intervals", intervals,
           "--", sys.executable, str(HERE / "matmul_load.py")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr
    return path


def test_sample_buffer_is_complete_and_agrees_with_the_energy_counter(recorded_run):
    with wattlab.open(str(recorded_run)) as run:
        samples = run.source("gpu0.samples")
        t_ns, power_w = samples.time_ns, samples.channel("power_w")
        raw_us = samples.time_raw
        energy = run.source("gpu0.energy")
        e_t_ns, e_j = energy.time_ns, energy.channel("energy_j")
        gaps = [g for g in run.gaps if g.source == "gpu0.samples"]
        phases = [(m.name, m.kind, m.time_ns) for m in run.markers]
        descriptor = samples.descriptor
    spacing_ms = np.diff(raw_us) / 1000
    duration_s = (raw_us[-1] - raw_us[0]) / 1e6
    rate_hz = (len(raw_us) - 1) / duration_s
    window = (t_ns >= e_t_ns[0]) & (t_ns <= e_t_ns[-1])
    t_w, p_w = t_ns[window], power_w[window]
    samples_j = float(np.sum(0.5 * (p_w[1:] + p_w[:-1]) * np.diff(t_w) / 1e9))
    counter_j = float(np.interp(t_w[-1], e_t_ns, e_j) - np.interp(t_w[0], e_t_ns, e_j))
    report = {
        "gpu": descriptor.get("model"), "driver": descriptor.get("firmware"),
        "samples": len(raw_us), "duration_s": duration_s, "rate_hz": rate_hz,
        "duplicates": int(np.sum(spacing_ms <= 0)),
        "spacing_ms_median": float(np.median(spacing_ms)),
        "spacing_ms_max": float(spacing_ms.max()), "gaps": len(gaps),
        "energy_samples_j": samples_j, "energy_counter_j": counter_j,
        "energy_error_pct": 100 * (samples_j - counter_j) / counter_j,
        "markers": len(phases),
    }
    print(json.dumps(report, indent=2))
    out = os.environ.get("OUT")
    if out:
        Path(out, recorded_run.with_suffix(".json").name).write_text(json.dumps(report, indent=2))
    assert report["duplicates"] == 0
    # The driver's own stamps jitter: on an H100 consecutive samples are 7-46 ms apart and
    # the rate is 49.5-49.8 Hz (tests/data/h100_nvml_seed11.npz and our own runs), so a
    # lost sample shows as a step beyond 50 ms or a rate below 49 Hz, not as one 40 ms step.
    assert 49.0 <= rate_hz <= 50.5
    assert report["spacing_ms_max"] < 50.0, "a sample is missing"
    assert gaps == []
    assert abs(report["energy_error_pct"]) < 2.0
    assert report["markers"] >= 12
