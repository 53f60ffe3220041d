"""The attribution core on synthetic arrays: shares, idle apart, the sum check, the fit.

Each expected number is worked out by hand from the power and the activities.
"""

from __future__ import annotations

import numpy as np
import pytest

from wattlab.analysis.attribution import Activity, Param, Rule, attribute, equal_rule
from wattlab.analysis.attribution import core as core_module
from wattlab.analysis.attribution.core import cumulative_energy
from wattlab.analysis.attribution.learn import fit_weights, free_stretches, measure_idle

pytestmark = pytest.mark.fast

T = np.linspace(0.0, 10.0, 10_001)


def test_overlapping_activities_share_equally_and_idle_stays_apart():
    # 100 W on a 40 W idle: 60 W dynamic; A runs 1..5, B 3..7, nothing 0..1 and 7..10
    acts = [Activity("A", "work", 1.0, 5.0), Activity("B", "work", 3.0, 7.0)]
    got = attribute(T, np.full(T.size, 100.0), 40.0, acts, equal_rule(["work"]))
    assert got.by_owner() == pytest.approx({"A": 2 * 60 + 2 * 30, "B": 2 * 30 + 2 * 60})
    assert got.idle_j == pytest.approx(400.0)
    assert got.unattributed_j == pytest.approx(4 * 60.0)  # above idle, nothing running
    assert got.total_j == pytest.approx(1000.0)
    assert got.closure_j == pytest.approx(0.0, abs=1e-9)


def test_weights_share_by_kind_and_intensity():
    rule = Rule("test", "fixed", {"prefill": Param(3.0), "decode": Param(1.0)})
    acts = [Activity("r1", "prefill", 0.0, 10.0), Activity("r2", "decode", 0.0, 10.0, 2.0)]
    got = attribute(T, np.full(T.size, 150.0), 50.0, acts, rule)
    # 1000 J dynamic shared 3 : 1 x 2
    assert got.parts_j == pytest.approx({("r1", "prefill"): 600.0, ("r2", "decode"): 400.0})


def test_a_span_and_activities_past_it_are_clipped():
    acts = [Activity("A", "work", -5.0, 2.0)]
    got = attribute(T, np.full(T.size, 10.0), 0.0, acts, equal_rule(["work"]), span_s=(1.0, 4.0))
    assert (got.t0_s, got.t1_s) == (1.0, 4.0)
    assert got.parts_j[("A", "work")] == pytest.approx(10.0)
    assert got.unattributed_j == pytest.approx(20.0)


def test_energy_between_samples_is_the_integral_of_the_line():
    t = np.array([0.0, 1.0, 3.0])
    p = np.array([0.0, 10.0, 30.0])  # p = 10 t
    got = cumulative_energy(t, p, np.array([0.5, 2.0, 3.0]))
    assert got == pytest.approx([5 * 0.25, 5 * 4.0, 5 * 9.0])


def test_the_sum_check_raises_when_the_parts_do_not_add_up(monkeypatch):
    # a sharing bug (every weight counted twice) must not pass silently
    real = core_module.running
    monkeypatch.setattr(core_module, "running", lambda e, a, v: 2 * real(e, a, v))
    with pytest.raises(RuntimeError, match="does not add up"):
        attribute(T, np.full(T.size, 100.0), 40.0, [Activity("A", "work", 1.0, 5.0)],
                  equal_rule(["work"]))


def _mixes() -> tuple[np.ndarray, list[Activity]]:
    acts = [Activity("a", "prefill", 1.0, 2.0), Activity("a", "decode", 2.0, 6.0),
            Activity("b", "prefill", 3.0, 3.5), Activity("b", "decode", 3.5, 8.0),
            Activity("c", "prefill", 4.0, 4.2), Activity("c", "decode", 4.2, 9.0)]
    def on(a: Activity) -> np.ndarray:
        return np.asarray((a.t0_s <= T) & (a.t1_s > T), dtype=float)

    n_pre = sum(on(a) for a in acts if a.kind == "prefill")
    n_dec = sum(on(a) for a in acts if a.kind == "decode")
    return 80.0 + 250.0 * n_pre + 40.0 * n_dec, acts


def test_the_fit_finds_each_kinds_power_with_its_error():
    power, acts = _mixes()
    noisy = power + np.random.default_rng(1).normal(0, 3.0, T.size)
    rule = fit_weights(T, noisy, 80.0, acts, kinds=["prefill", "decode"], min_piece_s=0.05)
    w = rule.weights
    assert abs(w["prefill"].value - 250.0) < 4 * (w["prefill"].pm or 0) + 1.0
    assert abs(w["decode"].value - 40.0) < 4 * (w["decode"].pm or 0) + 0.5
    assert 0 < (w["decode"].pm or 0) < 2.0
    assert "one kind alone: prefill 1, decode" in rule.notes[0]


def test_the_fit_falls_back_to_equal_shares_when_a_kind_never_runs():
    power, acts = _mixes()
    only_decode = [a for a in acts if a.kind == "decode"]
    rule = fit_weights(T, power, 80.0, only_decode, kinds=["prefill", "decode"],
                       min_piece_s=0.05)
    assert rule.name == "equal" and "equal shares" in rule.notes[0]


def test_idle_is_measured_where_nothing_runs_past_a_guard():
    power, acts = _mixes()
    got = measure_idle(T, power, [(a.t0_s, a.t1_s) for a in acts], guard_s=0.1, min_s=0.5)
    assert got is not None
    idle_w, pm_w, seconds = got
    assert idle_w == pytest.approx(80.0) and pm_w == pytest.approx(0.0, abs=1e-9)
    assert seconds == pytest.approx((1.0 - 0.2) + (1.0 - 0.2))  # 0..1 and 9..10, guarded
    assert measure_idle(T, power, [(0.0, 10.0)], guard_s=0.1, min_s=0.5) is None


def test_free_stretches_merge_overlapping_busy_intervals():
    assert free_stretches([(2, 4), (1, 3), (6, 7)], 0, 10) == [(0, 1), (4, 6), (7, 10)]
    assert free_stretches([(-1, 11)], 0, 10) == []


def test_rounding_of_the_running_weight_does_not_share_a_piece_where_nothing_runs():
    # found by docs/serving.md's example: with fitted weights (63.61 W, 24.04 W) the running
    # sum of weights left 7e-15 after every activity ended; that piece's energy divided by
    # it wrecked the shares (the sum check raised, 360 J of 1000 J missing)
    rule = Rule("fitted", "test", {"prefill": Param(63.61), "decode": Param(24.04)})
    acts = [Activity("a", "prefill", 1.0, 1.3), Activity("a", "decode", 1.3, 4.0),
            Activity("b", "prefill", 1.2, 1.5), Activity("b", "decode", 1.5, 3.0)]
    got = attribute(T, np.full(T.size, 100.0), 40.0, acts, rule)
    assert got.unattributed_j == pytest.approx(60.0 * (10 - 3))
    assert sum(got.parts_j.values()) == pytest.approx(60.0 * 3)


def _served(seed: int) -> tuple[np.ndarray, list[Activity]]:
    """30 staggered requests (prefill 0.1-0.3 s, decode 1-3 s): the additive power of each."""
    rng = np.random.default_rng(seed)
    acts = []
    for i, t0 in enumerate(np.sort(rng.uniform(0.2, 7.0, 30))):
        first = t0 + rng.uniform(0.1, 0.3)
        acts += [Activity(f"r{i}", "prefill", t0, first),
                 Activity(f"r{i}", "decode", first, first + rng.uniform(1.0, 3.0))]
    work = sum(np.asarray((a.t0_s <= T) & (a.t1_s > T), dtype=float)
               * (250.0 if a.kind == "prefill" else 40.0) for a in acts)
    return np.asarray(work), acts


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_power_that_saturates_with_the_work_in_flight_is_said_to_be_not_additive(seed):
    """Issue 40: where power saturates, a request's share depends on what ran beside it and
    its cost alone cannot be told from the run: the rule says so (additive: it does not)."""
    work_w, acts = _served(seed)
    noise = np.random.default_rng(seed).normal(0, 3.0, T.size)
    kinds = ["prefill", "decode"]
    assert fit_weights(T, 80.0 + work_w + noise, 80.0, acts, kinds=kinds,
                       min_piece_s=0.05).caveats == []
    saturating = 80.0 + 400.0 * (1.0 - np.exp(-work_w / 300.0)) + noise
    rule = fit_weights(T, saturating, 80.0, acts, kinds=kinds, min_piece_s=0.05)
    [caveat] = rule.caveats
    assert "not additive" in caveat and "saturates" in caveat and "cannot tell" in caveat
    assert rule.to_json()["caveats"] == [caveat]
