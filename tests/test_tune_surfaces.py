"""`tune --simulate` on the published surfaces (issue 38 item 2): the simulated job follows a
surface family (Zeus power limits, Kernel Tuner SM clocks, Ulisboa memory x SM clocks), so
every slowdown and saving tune measures can be checked against the surface's own."""

from __future__ import annotations

import math

import pytest

from tests.data_files import PUBLIC
from wattlab.commands.tune import driver_on_surface
from wattlab.device_models import SettingResponse
from wattlab.runfile.tuning_record import read_tuning
from wattlab.tuning.online import TunePlan, run_tune
from wattlab.tuning.search import SearchConfig
from wattlab.tuning.surfaces import public_surfaces

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


@pytest.mark.system
@pytest.mark.parametrize("family", FAMILIES)
def test_tune_measures_what_the_surface_says(surfaces, family, tmp_path):
    """Every setting tune measured: its slowdown and saving meet the surface's within
    Z standard errors (as tune states them); the kept one is within the bound."""
    surface = surfaces[family][0]
    driver, _ = driver_on_surface(surface.response(), seed=1)
    out = tmp_path / "t.h5"
    try:
        outcome = run_tune(TunePlan(list(surface.axes), SearchConfig(min_iters=3, max_iters=8),
                                    duration_s=20.0), driver, str(out), simulate=True)
    finally:
        driver.close()
    record = read_tuning(str(out))
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
    s = outcome.summary
    true_slow, true_saving = surface.truth(s["chosen"])
    assert true_slow <= s["max_slowdown"] + Z * s["slowdown_se"] + FLOOR, s
    assert abs(s["slowdown_measured"] - true_slow) <= Z * s["slowdown_se"] + FLOOR, s
    assert abs(s["energy_saving_measured"] - true_saving) <= Z * s["energy_saving_se"] + FLOOR
