"""bench/tune_limit.py: the goal's ceiling for a certifier told the surface in advance."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from wattlab.tuning.search import SearchConfig
from wattlab.tuning.surfaces import Surface

pytestmark = pytest.mark.fast

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def tune_limit(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("tune_limit")


def surface(time_s: list[float], energy_j: list[float]) -> Surface:
    """One knob; the default is its last (top) setting."""
    axis = tuple(float(100 * (i + 1)) for i in range(len(time_s)))
    return Surface("synthetic", {"sm_clock": axis}, np.array(energy_j), np.array(time_s))


def test_an_oracle_at_the_bound_needs_a_longer_run(tune_limit):
    """Oracle 4.9 % slower (bound 5 %), saving 30 %; nothing else keeps 95 % of that."""
    s = surface([1.2, 1.049, 1.0], [60.0, 70.0, 100.0])
    short = tune_limit.p_goal(s, SearchConfig(), 10000, 0.02)
    long = tune_limit.p_goal(s, SearchConfig(), 100000, 0.02)
    assert 0.3 < short < 0.5 < 0.9 < long
    assert tune_limit.p_goal(s, SearchConfig(), 10000, 0.005) > 0.9  # a steadier job


def test_a_setting_with_95_percent_of_the_saving_far_from_the_bound_is_certain(tune_limit):
    s = surface([1.2, 1.049, 1.01, 1.0], [60.0, 70.0, 71.0, 100.0])
    assert tune_limit.p_goal(s, SearchConfig(), 10000, 0.02) > 0.999


def test_nothing_to_certify_when_the_default_is_the_oracle(tune_limit):
    s = surface([1.2, 1.1, 1.0], [110.0, 105.0, 100.0])
    assert tune_limit.p_goal(s, SearchConfig(), 10000, 0.02) == 1.0
