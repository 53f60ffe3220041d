"""bench/validation.py helpers: noise from unconstrained workloads, picks vs measured argmin."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from wattlab.analysis.models.sweep_results import SweepTable

pytestmark = pytest.mark.fast

BENCH = Path(__file__).resolve().parent.parent / "bench"
LIMITS = np.array([100.0, 125.0, 150.0, 175.0])
FREE_J = np.array([600.0, 590.0, 540.0, 600.0])  # the same run four times: noise only
BOUND_J = np.array([1900.0, 1700.0, 1650.0, 1600.0])


@pytest.fixture
def validation(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("validation")


def table(x_name: str = "power_limit_w") -> SweepTable:
    """'free' draws 60 W (no limit binds: its four runs are repeats); 'bound' hits them."""
    bound_s = BOUND_J / np.minimum(LIMITS, 160.0)
    return SweepTable(x_name, ["free"] * 4 + ["bound"] * 4, np.tile(LIMITS, 2),
                      np.concatenate([FREE_J / 60.0, bound_s]), np.concatenate([FREE_J, BOUND_J]))


def test_noise_comes_only_from_workloads_no_limit_constrains(validation: ModuleType) -> None:
    free, sigma = validation.replicate_noise(table())
    assert free == ["free"]
    assert sigma == pytest.approx(np.std(np.log(FREE_J), ddof=1))
    free, sigma = validation.replicate_noise(table("sm_clock_mhz"))  # no limit: no repeats
    assert free == [] and np.isnan(sigma)


def test_pick_stats_separates_near_misses_from_misses(validation: ModuleType) -> None:
    t = table()
    noise = (["free"], 0.05)  # a difference below 2·√2·5 % ≈ 14 % is within the noise
    # 'free': one step off, 9 % more energy; 'bound': hit
    near = validation.pick_stats(t, {"free": 125.0, "bound": 175.0}, noise)
    assert near["agreement"] == 0.5 and near["within_one_step"] == 1.0
    assert near["within_noise"] == 1.0
    assert near["agreement_constrained"] == 1.0 and near["n_constrained"] == 1
    assert near["regret"] == pytest.approx((590.0 / 540.0 - 1.0) / 2)
    # 'bound' at 100 W: three steps off and 19 % more energy than at 175 W
    far = validation.pick_stats(t, {"bound": 100.0}, noise)
    assert far["agreement"] == far["within_one_step"] == far["agreement_constrained"] == 0.0
    assert far["within_noise"] == 0.0
