"""Every GPU of a several-GPU host (opt-in: WATTLAB_DEVICE=1; skips below 2 GPUs). Read-only.

Runs bench/multi_gpu.py and holds its results to the goals: every driver sample of every GPU
(>= 49.5 distinct readings/s, no duplicate), each GPU's energy within 0.3 % of its own
counter, and two agents on this host on one timebase (offsets under 50 us).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(os.environ.get("WATTLAB_DEVICE") != "1",
                       reason="needs real NVIDIA GPUs: set WATTLAB_DEVICE=1"),
]
BENCH = Path(__file__).resolve().parents[2] / "bench" / "multi_gpu.py"


def gpu_count() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if gpu_count() < 2:
        pytest.skip("needs 2 or more GPUs on this host")
    folder = tmp_path_factory.mktemp("multi")
    env = {**os.environ, "WATTLAB_BENCH_RESULTS": str(folder)}
    done = subprocess.run([sys.executable, str(BENCH), "--cycles", "3"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads((folder / "multi_gpu.json").read_text())


def test_every_sample_of_every_gpu(results: dict) -> None:
    rows = [r for r in results["rows"] if r["reader"] == "wattlab samples"]
    assert len(rows) == results["gpus"]
    for r in rows:
        assert r["distinct_per_s"] >= 49.5, r
        assert r["duplicates"] == 0, r


def test_each_gpus_energy_against_its_own_counter(results: dict) -> None:
    for r in results["rows"]:
        if r["reader"] in ("wattlab samples", "wattlab energy --window"):
            assert abs(r["energy_error_pct"]) < 0.3, r


def test_two_agents_on_one_host_share_one_timebase(results: dict) -> None:
    for name, agent in results["agents"].items():
        assert abs(agent["offset_ns"]) < 50_000, (name, agent)
