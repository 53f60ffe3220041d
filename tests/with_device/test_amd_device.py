"""`wattlab record --amd` on a real AMD GPU (opt-in: WATTLAB_DEVICE=1 and amdsmi). Read-only.

Records 20 s of an idle-then-busy GPU and checks what the simulated tests cannot: the real
amdsmi answers the calls the driver makes, the counter's energy agrees with the integrated
socket power within the plausibility check, and the node report counts the GPU as `amd0`.
The lent GPU machines are NVIDIA only, so this has not been run yet.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import wattlab
from wattlab.analysis.energy.node_energy import node_report

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(os.environ.get("WATTLAB_DEVICE") != "1",
                       reason="needs a real GPU: set WATTLAB_DEVICE=1"),
]


def test_record_amd_gpu0(tmp_path):
    pytest.importorskip("amdsmi", reason="needs amdsmi and ROCm (an AMD GPU host)")
    out = tmp_path / "amd.h5"
    subprocess.run([sys.executable, "-m", "wattlab.cli", "record", "--amd", "0",
                    "--no-live", "-o", str(out), "--duration", "20"], check=True)
    with wattlab.open(str(out)) as run:
        assert {"amd0.power", "amd0.energy", "amd0.state"} <= set(run.sources)
        report = node_report(run)
        print(run.source("amd0.energy").descriptor["config"])
    parts = {p["part"]: p for p in report["nodes"][0]["parts"]}
    assert parts["amd0"]["energy_j"] > 0
    assert not [n for n in report["notes"] if "implausible" in n], report["notes"]
