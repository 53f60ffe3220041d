"""The update period behind polls at a similar rate (90 ms polls, 100 ms updates), and on real
H100 traces recorded at the default cadence."""

from __future__ import annotations

import numpy as np
import pytest

import wattlab
from tests.data_files import DATA
from wattlab.analysis.calibration.poll_lattice import fit_poll_lattice

pytestmark = pytest.mark.fast


def polled(update_s: float, poll_s: float, seconds: float, *, jitter_s: float = 0.0,
           repeat_fraction: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Poll times and the values they saw of a driver that updates every ``update_s``."""
    rng = np.random.default_rng(seed)
    polls = np.arange(0.0, seconds, poll_s) + 0.0123
    polls = np.sort(polls + rng.normal(0, jitter_s, polls.size))
    ticks = np.floor(polls / update_s).astype(int)
    values = 100.0 + rng.normal(0, 5, ticks.max() + 1)
    # some updates repeat the value before them (an idle GPU's reading does)
    same = rng.random(values.size) < repeat_fraction
    for k in np.flatnonzero(same)[1:] if same[0] else np.flatnonzero(same):
        if k > 0:
            values[k] = values[k - 1]
    return polls, values[ticks]


@pytest.mark.parametrize(("update_s", "poll_s"), [(0.1, 0.09), (0.1, 0.07), (0.12, 0.09),
                                                  (0.1, 0.06)])
def test_the_period_is_the_drivers_not_the_polls(update_s, poll_s):
    t, v = polled(update_s, poll_s, 40.0, jitter_s=0.0005, repeat_fraction=0.02)
    fit = fit_poll_lattice(t, v)
    assert fit is not None
    assert fit.period_s == pytest.approx(update_s, abs=3 * fit.period_se_s + 2e-4)
    assert fit.period_se_s < 0.002
    # each reading's update instant is the driver's, to within the ticks' gain on the polls
    # (the phase of the lattice is known to half of it, its period's error adds up over it)
    first_seen = t[np.concatenate(([True], v[1:] != v[:-1]))]
    true_update = np.floor(first_seen / update_s) * update_s
    assert np.abs(fit.update_t_s - true_update)[1:].max() < (update_s - poll_s) + 0.003


def test_no_period_when_every_poll_sees_news_or_nothing_repeats_on_a_lattice():
    t = np.arange(0, 30, 0.09)
    assert fit_poll_lattice(t, np.arange(t.size, dtype=float)) is None  # updates ≥ polls
    rng = np.random.default_rng(3)
    values = np.cumsum(rng.random(t.size) < 0.85).astype(float)  # random repeats only
    assert fit_poll_lattice(t, values) is None
    assert fit_poll_lattice(t[:10], values[:10]) is None  # too few polls


@pytest.mark.parametrize("trace", ["torch-long", "lightning", "square-1hz", "torch-short"])
def test_real_h100_average_updates_every_100_ms_under_90_ms_polls(trace):
    with wattlab.open(str(DATA / "traces" / f"h100_{trace}.h5")) as run:
        view = run.source("gpu0.power")
        t = view.time_ns.astype(np.float64) / 1e9
        values = view.channel("average_power_w").astype(np.float64)
    assert np.median(np.diff(t)) == pytest.approx(0.09, abs=1e-3)  # the default cadence
    fit = fit_poll_lattice(t, values)
    assert fit is not None
    assert fit.period_s == pytest.approx(0.100, abs=0.001)


def test_binomial_tail_matches_scipy():
    from scipy.stats import binom

    from wattlab.analysis.calibration.poll_lattice import binomial_tail

    for k, n, p in [(5, 6, 0.15), (30, 33, 0.1), (3, 40, 0.02), (10, 10, 0.5), (1, 1, 0.3)]:
        assert binomial_tail(k, n, p) == pytest.approx(binom.sf(k - 1, n, p), rel=1e-9)
    assert binomial_tail(0, 10, 0.5) == 1.0
    assert binomial_tail(1, 10, 0.0) == 0.0
    assert binomial_tail(11, 10, 0.5) == 0.0
