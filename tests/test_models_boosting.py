"""Boosted curves: batched leave-one-out is refitting without the row; tree count held out."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_models import synthetic
from wattlab.analysis.models.boosting import BoostedCurves
from wattlab.analysis.models.energy_models import fit_sweep, unseen_workload_picks
from wattlab.analysis.models.sweep_results import SweepTable


def curves(noise: float, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eight workloads × nine settings: log time = -log(min(x, demand)) + workload level."""
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(8), 9)
    x = np.tile(np.linspace(0.3, 1.0, 9), 8)
    features = np.column_stack([x, group.astype(np.float64)])
    y = -np.log(np.minimum(x, 0.4 + 0.07 * group)) + 0.3 * group
    return features, group, y + noise * rng.standard_normal(y.shape[0])


@pytest.mark.fast
def test_batched_loo_is_refitting_without_the_row() -> None:
    x, group, y = curves(noise=0.02)
    model = BoostedCurves(n_trees=12, depth=3)
    held = np.array([0, 13, 40, 71])
    path = model._loo_path(x, group, y, held)
    for j, i in enumerate(held):
        others = np.delete(np.arange(y.shape[0]), i)
        for k in (1, 5, 12):
            alone = BoostedCurves(n_trees=k, depth=3).fit(x[others], group[others], y[others])
            assert path[k - 1, j] == pytest.approx(alone.predict(x[i:i + 1], group[i:i + 1])[0],
                                                   abs=1e-12)


@pytest.mark.fast
def test_tree_count_is_chosen_by_held_out_error() -> None:
    x, group, y = curves(noise=0.01)
    held = np.arange(y.shape[0])
    values, count = BoostedCurves(n_trees=60).loo(x, group, y, held)
    assert count >= 40  # a real shape: more trees keep helping
    assert np.mean(np.abs(values - y)) < 0.05
    flat = 0.3 * group + 0.05 * np.random.default_rng(2).standard_normal(y.shape[0])
    _, count = BoostedCurves(n_trees=60).loo(x, group, flat, held)
    assert count <= 10  # noise around each workload's level: trees only fit noise


@pytest.mark.fast
def test_unseen_workload_gets_the_mean_level() -> None:
    x, group, y = curves(noise=0.0)
    model = BoostedCurves(n_trees=20).fit(x[group < 7], group[group < 7], y[group < 7])
    seen = model.predict(x[:9], group[:9])
    unseen = model.predict(x[:9], np.full(9, 99))
    assert np.allclose(unseen - seen, model.base - model.offset[0])


@pytest.mark.fast
def test_boosted_is_cross_validated_on_every_row_with_its_tree_counts() -> None:
    t = synthetic(workloads=4, noise=0.01)
    report = fit_sweep(t, "energy", None, families=("pchip", "boosted"),
                       boost={"n_trees": 40})
    boosted = next(s for s in report.families if s.family == "boosted")
    assert boosted.n_heldout == boosted.n_predicted == len(t)  # the same rows as pchip
    assert boosted.trees is not None and all(1 <= k <= 40 for k in boosted.trees)
    assert report.to_json()["families"][1]["trees"] == boosted.trees


@pytest.mark.system
def test_unseen_workload_pick_ignores_the_workloads_own_runs() -> None:
    t = synthetic(workloads=5, noise=0.01)
    picks = unseen_workload_picks(t, "energy", (40, 40))
    assert set(picks) == {"w0", "w1", "w2", "w3", "w4"}
    # make w2 far cheaper at 100 W: its own fit follows, the unseen pick cannot
    slow = np.where(np.array(t.workload) == "w2", (t.x / 100.0) ** 2, 1.0)
    moved = SweepTable(t.x_name, t.workload, t.x, t.runtime_s * slow, t.energy_j * slow,
                       features=t.features)
    assert unseen_workload_picks(moved, "energy", (40, 40))["w2"] == picks["w2"]
    own = fit_sweep(moved, "energy", None, families=("boosted",), boost={"n_trees": 40})
    assert next(r for r in own.recommendations if r.workload == "w2").recommended_x == 100.0
