"""Framework markers on the GPU's time, on a real GPU (opt-in: WATTLAB_DEVICE=1; issue 26).

Records ``wattlab record --nvml 0 --auto-markers -- python gpu_jobs.py JOB`` for a Lightning
job, a plain-PyTorch loop and a Hugging Face Trainer job (unmodified code, ~0.2 s steps of
matrix products, no synchronisation in the loop) and checks the issue's goals:

- >= 95 % of the energy above idle during training lies inside the step windows (GPU time);
- each step's energy from ``wattlab energy --by-marker`` matches the 50 Hz samples' own
  integral over the same GPU-time window within 5 %.

Numbers per job go to $OUT/gpu_markers_<job>.json (and the run files stay there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu_marker_goals import assert_goals, measure

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(os.environ.get("WATTLAB_DEVICE") != "1",
                       reason="needs a real NVIDIA GPU: set WATTLAB_DEVICE=1"),
]

HERE = Path(__file__).resolve().parent
@pytest.fixture(scope="module", params=["lightning", "torch", "hf"])
def recorded(request: Any, tmp_path_factory: Any) -> tuple[str, Path]:
    job = request.param
    out = os.environ.get("OUT")
    folder = Path(out) if out else tmp_path_factory.mktemp("gpu_markers")
    path = folder / f"gpu_markers_{job}.h5"
    if path.exists():
        path.unlink()
    cmd = [sys.executable, "-m", "wattlab.cli", "record", "--nvml", "0", "--auto-markers",
           "-o", str(path), "--", sys.executable, str(HERE / "gpu_jobs.py"), job]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    print(result.stdout[-3000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stderr[-3000:]
    return job, path


def measure_and_keep(job: str, path: Path) -> dict[str, Any]:
    result = measure(job, path)
    print(json.dumps(result, indent=2))
    out = os.environ.get("OUT")
    if out:
        Path(out, f"gpu_markers_{job}.json").write_text(json.dumps(result, indent=2))
    return result


def test_the_recorded_job_meets_the_goals(recorded: tuple[str, Path]) -> None:
    assert_goals(measure_and_keep(*recorded))
