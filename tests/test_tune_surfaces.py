"""`tune --simulate` on the published surfaces (issue 38 item 2): the simulated job follows a
surface family (Zeus power limits, Kernel Tuner SM clocks, Ulisboa memory x SM clocks), so
every slowdown and saving tune measures can be checked against the surface's own."""

from __future__ import annotations

import fcntl
import math
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.data_files import PUBLIC
from wattlab.commands.tune import driver_on_surface
from wattlab.device_models import SettingResponse
from wattlab.runfile.tuning_record import read_tuning
from wattlab.tuning.online import TunePlan, run_tune
from wattlab.tuning.search import SearchConfig
from wattlab.tuning.surfaces import Surface, public_surfaces

FAMILIES = ("zeus-a40", "zeus-v100", "kt-rtx4000ada", "kt-a100", "ulisboa-titanx")
Z = 3.0  # standard errors within which a measurement must meet the truth
FLOOR = 0.005  # and a floor: the 50 Hz samples' edges cost a little on short iterations


@pytest.fixture(scope="module")
def surfaces():
    return public_surfaces(PUBLIC)


@pytest.mark.fast
def test_the_response_is_the_surface_at_its_settings_and_between_them(surfaces):
    kt = surfaces["kt-a100"][0]
    idx = (3,)
    clock = kt.axes["sm_clock"][3]
    slow, saving = kt.truth({"sm_clock": clock})
    t0, e0 = kt.time_s[kt.default], kt.energy_j[kt.default]
    assert slow == pytest.approx(kt.time_s[idx] / t0 - 1)
    assert saving == pytest.approx(1 - kt.energy_j[idx] / e0)
    mid = (clock + kt.axes["sm_clock"][4]) / 2
    t_mid = kt.response().ratios({"sm_clock": mid})[0]
    assert t_mid == pytest.approx((kt.time_s[3] + kt.time_s[4]) / 2 / t0)
    assert kt.response().ratios({}) == (1.0, 1.0)  # no setting named: the default
    with pytest.raises(Exception, match="axes"):
        SettingResponse("bad", {"fan": (1.0,)}, kt.time_s[:1], kt.energy_j[:1], 1.0)


def tune_on(surface: Surface, out: Path) -> None:
    """One whole `tune --simulate` run of 20 s on the surface: session, recorder, the
    iterations found in the 50 Hz samples, settings applied through NVML; what it measured
    and decided is in ``out``'s tuning record."""
    driver, _ = driver_on_surface(surface.response(), seed=1)
    try:
        run_tune(TunePlan(list(surface.axes), SearchConfig(min_iters=3, max_iters=8),
                          duration_s=20.0), driver, str(out), simulate=True)
    finally:
        driver.close()


@pytest.fixture(scope="module")
def tuned(surfaces, tmp_path_factory, worker_id) -> Path:
    """The folder of every family's tune run, made once for the test run (issue 34).

    Each run spends its 20 s waiting on its simulated GPU's real-time clock (the five
    together used ~6 s of CPU in 22 s here), so one after another cost five times the wall
    time for nothing: the five run at once, each with its own GPU, driver, session and
    file. Under xdist the first worker to get here runs them (a lock on a folder the run's
    workers share) and the others read the files; a run that raised leaves its error for
    its own case to fail with.
    """
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # this test run's own, above each worker's folder
    folder = shared / "tune_surfaces"
    folder.mkdir(exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "done").exists():
            with ThreadPoolExecutor(len(FAMILIES), thread_name_prefix="tune") as pool:
                runs = {f: pool.submit(tune_on, surfaces[f][0], folder / f"{f}.h5")
                        for f in FAMILIES}
            for f, run in runs.items():
                if (error := run.exception()) is not None:
                    (folder / f"{f}.error").write_text("".join(
                        traceback.format_exception(error)))
            (folder / "done").touch()
    return folder


@pytest.mark.system
@pytest.mark.parametrize("family", FAMILIES)
def test_tune_measures_what_the_surface_says(surfaces, tuned, family):
    """Every setting tune measured: its slowdown and saving meet the surface's within
    Z standard errors (as tune states them); the kept one is within the bound."""
    surface = surfaces[family][0]
    error = tuned / f"{family}.error"
    assert not error.exists(), error.read_text()
    record = read_tuning(str(tuned / f"{family}.h5"))
    assert record is not None
    p = record.probes
    checked = 0
    for k in range(1, len(p.energy_j)):
        if p.iterations[k] < 3:
            continue  # abandoned or cut short by the run's end
        setting = {knob: float(v[k]) for knob, v in p.settings.items()}
        slow, saving = surface.truth(setting)
        t_ratio, e_ratio = p.time_s[k] / p.time_s[0], p.energy_j[k] / p.energy_j[0]
        se_t = t_ratio * math.hypot(p.time_se_s[k] / p.time_s[k], p.time_se_s[0] / p.time_s[0])
        se_e = e_ratio * math.hypot(p.energy_se_j[k] / p.energy_j[k],
                                    p.energy_se_j[0] / p.energy_j[0])
        assert abs(t_ratio - 1 - slow) <= Z * se_t + FLOOR, (setting, t_ratio - 1, se_t, slow)
        assert abs(1 - e_ratio - saving) <= Z * se_e + FLOOR, (setting, 1 - e_ratio, se_e,
                                                               saving)
        checked += 1
    assert checked >= 1, p
    s = record.summary
    true_slow, true_saving = surface.truth(s["chosen"])
    assert true_slow <= s["max_slowdown"] + Z * s["slowdown_se"] + FLOOR, s
    assert abs(s["slowdown_measured"] - true_slow) <= Z * s["slowdown_se"] + FLOOR, s
    assert abs(s["energy_saving_measured"] - true_saving) <= Z * s["energy_saving_se"] + FLOOR
