"""`wattlab excite` on a real GPU (opt-in: WATTLAB_DEVICE=1). Read-only on the card: it only
runs matrix products. The H100's 1 s average must come out identifiable within 60 s, as a
1.00 ± 0.05 s boxcar with a 0.50 ± 0.05 s effective delay updated every 100 ± 5 ms."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(os.environ.get("WATTLAB_DEVICE") != "1",
                       reason="needs a real NVIDIA GPU: set WATTLAB_DEVICE=1"),
]


@pytest.mark.parametrize("seed", [1, 2])
def test_excite_identifies_the_one_second_average_in_a_minute(tmp_path, seed):
    out = os.environ.get("OUT") or str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "wattlab.cli", "excite", "--duration", "60",
                           "--seed", str(seed), "-o", f"{out}/excite-{seed}.h5", "--json"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    with open(f"{out}/excite-{seed}.json", "w") as f:
        json.dump(summary, f, indent=2)
    average = next(v for v in summary["views"] if v["view"] == "average_power_w")
    assert average["identifiable"] is True, average["warnings"]
    assert average["width_s"]["value"] == pytest.approx(1.0, abs=0.05)
    assert average["effective_delay_s"]["value"] == pytest.approx(0.5, abs=0.05)
    assert average["update_period_s"] == pytest.approx(0.1, abs=0.005)
