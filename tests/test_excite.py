"""`wattlab excite`: a random telegraph that identifies the kernel (simulated GPU here; the
real H100 in tests/with_device/test_excite.py)."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import wattlab
from wattlab.acquisition.experiments.telegraph_schedule import seconds_for, telegraph
from wattlab.analysis.calibration.identifiability import repeating_share
from wattlab.errors import UsageError

WATTLAB = [sys.executable, "-m", "wattlab.cli"]


@pytest.mark.fast
def test_telegraph_holds_are_random_within_bounds_and_never_repeat_a_level():
    schedule = telegraph(5, 120.0, min_hold_s=0.1, max_hold_s=3.0)
    holds = np.array([s.duration_s for s in schedule.segments])
    levels = [s.utilisation for s in schedule.segments]
    assert holds.sum() == pytest.approx(120.0)
    assert holds[:-1].min() >= 0.1 - 1e-9 and holds.max() <= 3.0 + 1e-9
    assert all(a != b for a, b in itertools.pairwise(levels))
    assert set(levels) == {0.0, 0.5, 1.0}
    # no repetition for a kernel to hide in (a 1 Hz square wave scores ~0.75 here)
    t = np.arange(0, 120, 0.01)
    _, share = repeating_share(schedule.utilisation_at(t), 0.01)
    assert share < 0.3
    assert telegraph(5, 10.0).segments == telegraph(5, 10.0).segments  # seeded


@pytest.mark.fast
@pytest.mark.parametrize(("kwargs", "named"), [
    ({"duration_s": 0.0}, "duration"), ({"duration_s": math.inf}, "duration"),
    ({"min_hold_s": 2.0, "max_hold_s": 1.0}, "holds"), ({"min_hold_s": 0.0}, "holds"),
    ({"levels": (1.0, 1.0)}, "levels"), ({"levels": (0.0, 1.5)}, "levels")])
def test_bad_telegraphs_are_refused(kwargs, named):
    args = {"duration_s": 10.0, **kwargs}
    with pytest.raises(UsageError, match=named):
        telegraph(1, **args)


@pytest.mark.fast
def test_seconds_for_a_target_scales_as_one_over_root_time():
    assert seconds_for(0.01, 0.005, 60.0) == pytest.approx(240.0)
    assert math.isnan(seconds_for(0.0, 0.005, 60.0))


@pytest.mark.system
def test_excite_on_the_simulated_gpu_identifies_the_one_second_average(tmp_path):
    out = tmp_path / "excite.h5"
    done = subprocess.run([*WATTLAB, "excite", "--simulate", "--duration", "15", "--seed", "3",
                           "-o", str(out), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    views = {v["view"]: v for v in json.loads(done.stdout)["views"]}
    average = views["average_power_w"]
    assert average["identifiable"] is True, average["warnings"]
    assert average["kernel"] == "boxcar"
    assert average["width_s"]["value"] == pytest.approx(1.0, abs=0.05)
    assert average["update_period_s"] == pytest.approx(0.1, abs=0.005)
    with wattlab.open(str(out)) as run:
        names = {m.name for m in run.markers}
    assert any(name.startswith("level ") for name in names)  # every hold is marked
    import h5py

    with h5py.File(out, "r") as f:
        assert "gpu0.power:average_power_w" in f["analysis/calibration"]


@pytest.mark.system
@pytest.mark.parametrize(("flags", "named"), [
    (["--duration", "0"], "--duration"), (["--min-hold", "2", "--max-hold", "1"], "holds"),
    (["--target-se-ms", "0"], "--target-se-ms")])
def test_excite_refuses_bad_input(tmp_path, flags, named):
    done = subprocess.run([*WATTLAB, "excite", "--simulate", "-o", str(tmp_path / "x.h5"),
                           *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert named in done.stderr
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.system
def test_excite_on_a_machine_without_a_gpu_says_why(tmp_path):
    pytest.importorskip("pynvml")
    from wattlab.drivers.nvml import NvmlDriver

    try:
        NvmlDriver().open()
    except Exception:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    done = subprocess.run([*WATTLAB, "excite", "-o", str(tmp_path / "x.h5")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "NVML" in done.stderr
