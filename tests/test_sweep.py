"""The sweep runner against the simulated GPU: results, restore on error and on signals.

Never against a real GPU: every sweep here uses the simulated one (``--simulate``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import wattlab
from tests.conftest import Spawn
from wattlab.acquisition.experiments.sweep_runner import (
    SweepPlan,
    open_driver,
    parse_settings,
    run_sweep,
)
from wattlab.analysis.models.sweep_results import measure_run, read_sweep
from wattlab.cli import main
from wattlab.device_models.workload_schedule import WorkloadSchedule
from wattlab.drivers.nvml import NvmlDriver
from wattlab.errors import NvmlError, UsageError
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import SimulatedGpu


@pytest.mark.fast
def test_parse_settings() -> None:
    assert parse_settings("150:300:25", "power_limit") == [150, 175, 200, 225, 250, 275, 300]
    assert parse_settings("345, 600,600", "sm_clock") == [345, 600]
    for bad in ("300:150:25", "1:2", "a,b", "0,100", "150:300:0"):
        with pytest.raises(UsageError, match="power limit list"):
            parse_settings(bad, "power_limit")


@pytest.mark.fast
def test_dry_run_prints_plan_and_checks_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--simulate", "--power-limits", "200:700:250", "--repeat", "2",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 settings x 2 repeat(s) = 6 runs" in out and "now power limit 700 W" in out
    assert main(["sweep", "--simulate", "--power-limits", "100,300", "--dry-run"]) == 2
    assert "100 W outside its range 200-700 W" in capsys.readouterr().err
    assert main(["sweep", "--simulate", "--sm-clocks", "1000", "--dry-run"]) == 2
    assert "nearest: 1005 MHz" in capsys.readouterr().err
    assert main(["sweep", "--simulate", "--mem-clocks", "1600", "--dry-run"]) == 2
    assert "memory clock(s) 1600 MHz not supported (nearest: 1593 MHz" in capsys.readouterr().err
    assert main(["sweep", "--simulate", "--mem-clocks", "1593,2619", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "memory clock unlocked" in out and "memory clock 1593 MHz, repeat 1/1" in out


@pytest.mark.system
def test_sweep_records_each_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "s.h5")
    assert main(["sweep", "--simulate", "--sm-clocks", "600,1980", "--sim-work", "0.3",
                 "-o", out]) == 0
    text = capsys.readouterr().out
    assert '"sm_clocks": "reset"' in text and "about 0 s left" in text
    t = read_sweep(out)
    assert t.attrs["complete"] and not t.attrs["interrupted"]
    assert t.x.tolist() == [600.0, 1980.0] and t.status == ["ok", "ok"]
    # fixed work: the low clock takes longer, as the physics says (1980/600 at full util,
    # less where the 700 W cap already slows the top clock)
    assert 2.0 < t.runtime_s[0] / t.runtime_s[1] < 3.4
    assert t.sm_clock_mhz[0] == pytest.approx(600.0)
    assert 600.0 < t.sm_clock_mhz[1] <= 1980.0  # a 0.36 s run has its clock readings too
    true_j = np.asarray(t.energies_j["true"])
    # NVML agrees with the true energy: the samples to 5 %; the counter moves every 100 ms,
    # and a read late at a setting's edge (a busy machine) can put one update on the wrong
    # side: 5 % plus one update's energy at the setting's mean power
    np.testing.assert_allclose(t.energies_j["nvml_samples"], true_j, rtol=0.05)
    update_j = 0.1 * true_j / np.asarray(t.runtime_s)
    assert np.all(np.abs(np.asarray(t.energies_j["nvml_energy"]) - true_j)
                  <= 0.05 * true_j + update_j), (t.energies_j["nvml_energy"], true_j)
    runs = sorted((tmp_path / "s.runs").iterdir())
    assert [p.name for p in runs] == ["sm_clock_mhz-1980-r0.h5", "sm_clock_mhz-600-r0.h5"]
    assert measure_run(str(runs[1]), 0, None)[0] > t.runtime_s[0]  # to the end marker
    assert main(["sweep", "--simulate", "--sm-clocks", "600", "-o", out]) == 2  # no overwrite


@pytest.mark.system
def test_error_mid_sweep_restores(tmp_path: Path) -> None:
    driver, gpu, _ = open_driver(True, 0)
    calls = []

    def measure(path: str, g: int, runtime: float | None) -> tuple[float, dict[str, float],
                                                                   dict[str, float]]:
        calls.append(gpu.power_limit_w)
        raise RuntimeError("disk full")

    try:
        plan = SweepPlan("power_limit", [300.0, 400.0], sim_work_s=0.1)
        with pytest.raises(RuntimeError, match="disk full"):
            run_sweep(plan, driver, str(tmp_path / "e.h5"), measure=measure,
                      save=lambda r, a: None, sim_gpu=gpu, log=lambda s: None)
        assert calls == [300.0] and gpu.power_limit_w == 700.0
        # out of range: refused before anything changes
        with pytest.raises(UsageError, match="outside its range"):
            run_sweep(SweepPlan("power_limit", [300.0, 800.0]), driver, str(tmp_path / "f.h5"),
                      measure=measure, save=lambda r, a: None, sim_gpu=gpu)
        assert calls == [300.0]
        # no permission (not root): a clear error, the card unchanged
        gpu.settable = False
        with pytest.raises(NvmlError, match="needs root"):
            run_sweep(SweepPlan("power_limit", [300.0]), driver, str(tmp_path / "g.h5"),
                      measure=measure, save=lambda r, a: None, sim_gpu=gpu)
        assert gpu.power_limit_w == 700.0
    finally:
        driver.close()


@pytest.mark.system
def test_failing_workload_is_recorded_and_sweep_goes_on(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "f.h5")
    code = main(["sweep", "--simulate", "--power-limits", "300,500", "-o", out, "--",
                 sys.executable, "-c", "import sys; sys.exit(3)"])
    assert code == 1
    assert "failed at 2 run(s)" in capsys.readouterr().err
    t = read_sweep(out)
    assert t.status == ["failed", "failed"] and t.attrs["complete"]
    assert json.loads(t.attrs["restored_json"]) == {"power_limit_w": 700.0}


@pytest.mark.system
def test_a_command_run_keeps_recording_past_its_end(tmp_path: Path) -> None:
    """The counter's last in-step read must come after the window's end (see SIM_TAIL_S)."""
    out = str(tmp_path / "c.h5")
    assert main(["sweep", "--simulate", "--power-limits", "300", "-o", out, "--",
                 sys.executable, "-c", "import time; time.sleep(0.3)"]) == 0
    (run,) = (tmp_path / "c.runs").iterdir()
    with wattlab.open(str(run)) as r:
        end_ns = next(m.time_ns for m in r.markers if m.source == "session" and m.kind == "end")
        energy_t = r.source("gpu0.energy").time_ns
    in_step = energy_t[np.abs(np.diff(energy_t, prepend=0) - 1e8) < 2e7]  # 100 ms after one
    assert in_step[-1] > end_ns + 0.1e9


@pytest.mark.system
def test_a_command_run_ends_with_the_command_not_the_simulated_work(tmp_path: Path) -> None:
    """--sim-work is the run's length only without a command: a command slower than the
    simulated work (a slow start on a busy machine) was killed by SIGTERM as "failed"."""
    out = str(tmp_path / "w.h5")
    assert main(["sweep", "--simulate", "--sim-work", "0.1", "--power-limits", "700", "-o",
                 out, "--", sys.executable, "-c", "import time; time.sleep(1.0)"]) == 0
    t = read_sweep(out)
    assert t.status == ["ok"] and t.runtime_s[0] >= 1.0


@pytest.mark.system
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_sweep_restores(tmp_path: Path, signum: int, spawn: Spawn) -> None:
    out = str(tmp_path / "sig.h5")
    proc = spawn(
        [sys.executable, "-u", "-m", "wattlab.cli", "sweep", "--simulate", "--power-limits",
         "200:700:100", "--sim-work", "0.3", "-o", out],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    while time.monotonic() < deadline:  # wait for the first finished run
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("[1/6]") or not line:
                break
    assert lines and lines[-1].startswith("[1/6]"), lines
    time.sleep(0.8)  # well inside the second run
    os.kill(proc.pid, signum)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert 'restored: {"power_limit_w": 700.0}' in stdout
    t = read_sweep(out)
    assert t.attrs["interrupted"] and not t.attrs["complete"]
    assert 1 <= len(t) < 6
    assert json.loads(t.attrs["restored_json"]) == {"power_limit_w": 700.0}


def _fixed_clock_gpu(util: float = 1.0) -> tuple[SimulatedGpu, list[int]]:
    now = [0]
    gpu = SimulatedGpu(seed=5, schedule=WorkloadSchedule.constant(util, 100.0),
                       clock_ns=lambda: now[0], start_ns=0, unix_offset_ns=0)
    return gpu, now


@pytest.mark.fast
def test_memory_clock_physics_of_the_simulated_gpu() -> None:
    s = 1_000_000_000
    base, _ = _fixed_clock_gpu()
    untouched = (base.work_done(0, 2 * s), base.true_energy_j(0, 2 * s))
    gpu, now = _fixed_clock_gpu()
    gpu.set_power_limit_w(400.0)
    ref, _ = _fixed_clock_gpu()
    ref.set_power_limit_w(400.0)
    # locking the memory clock at its default (top) clock changes nothing, to the bit
    gpu.set_locked_mem_clocks_mhz(2619, 2619)
    assert gpu.mem_clock_mhz == 2619
    assert (gpu.work_done(0, s), gpu.true_energy_j(0, s)) == (ref.work_done(0, s),
                                                              ref.true_energy_j(0, s))
    now[0] = s
    gpu.set_locked_mem_clocks_mhz(1593, 1593)
    assert gpu.mem_clock_mhz == 1593 and gpu.locked_mem_clocks_mhz == (1593.0, 1593.0)
    w_low, p_low = gpu.work_done(s, 2 * s), gpu.mean_power_w(s, 2 * s)
    w_ref, p_ref = ref.work_done(s, 2 * s), ref.mean_power_w(s, 2 * s)
    # the memory-bound 30 % of the work takes 2619/1593 times as long; the power cap
    # (400 W) gives the core the memory's saved watts, so it speeds up a little
    slow = 1 + 0.3 * (2619 / 1593 - 1)
    assert w_ref / w_low == pytest.approx(slow, rel=0.06)
    assert w_ref / w_low < slow
    assert p_low == pytest.approx(p_ref, rel=0.02)  # still at the cap
    # uncapped (half load: 570 W under the 700 W limit): memory power falls with the clock
    free, now2 = _fixed_clock_gpu(0.5)
    now2[0] = s
    free.set_locked_mem_clocks_mhz(1593, 1593)
    now2[0] = 2 * s
    free.reset_locked_mem_clocks()
    assert free.mem_clock_mhz == 2619
    drop = free.mean_power_w(0, s) - free.mean_power_w(s, 2 * s)
    assert drop == pytest.approx((15 + 120 * 0.5) * (1 - 1593 / 2619), rel=0.1)
    assert free.work_done(0, s) / free.work_done(s, 2 * s) == pytest.approx(slow, rel=1e-3)
    assert (base.work_done(0, 2 * s), base.true_energy_j(0, 2 * s)) == untouched


@pytest.mark.fast
def test_memory_clock_driver_setters_through_fake_nvml() -> None:
    gpu, _ = _fixed_clock_gpu()
    fake = FakeNvml([gpu])
    with NvmlDriver(fake) as driver:
        driver.lock_memory_clocks(0, 1593, 1593)
        assert driver.read_state(0)["mem_clock_hz"] == 1593e6
        driver.reset_memory_clocks(0)
        assert driver.read_state(0)["mem_clock_hz"] == 2619e6 and gpu.locked_mem_clocks_mhz is None
        assert "nvmlDeviceSetMemoryLockedClocks" in fake.calls
        with pytest.raises(UsageError, match="memory clock range 2000-1000 MHz"):
            driver.lock_memory_clocks(0, 2000, 1000)
        gpu.settable = False
        with pytest.raises(NvmlError, match="GPU 0: locking the memory clock needs root"):
            driver.lock_memory_clocks(0, 1593, 1593)
        with pytest.raises(NvmlError, match="resetting the memory clock needs root"):
            driver.reset_memory_clocks(0)


@pytest.mark.system
def test_memory_clock_sweep_restores_on_error(tmp_path: Path) -> None:
    driver, gpu, _ = open_driver(True, 0)
    seen = []

    def measure(path: str, g: int, runtime: float | None) -> tuple[float, dict[str, float],
                                                                   dict[str, float]]:
        seen.append(gpu.mem_clock_mhz)
        raise RuntimeError("disk full")

    try:
        with pytest.raises(RuntimeError, match="disk full"):
            run_sweep(SweepPlan("mem_clock", [1593.0, 2619.0], sim_work_s=0.1), driver,
                      str(tmp_path / "m.h5"), measure=measure, save=lambda r, a: None,
                      sim_gpu=gpu, log=lambda s: None)
        assert seen == [1593] and gpu.locked_mem_clocks_mhz is None
        assert gpu.mem_clock_mhz == 2619
    finally:
        driver.close()
