"""The own first-order filter equals the recursion it replaces (scipy's lfilter) to rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.signal import lfilter

from wattlab.device_models.recursive_filter import first_order_filter

pytestmark = pytest.mark.fast


def _loop(x: np.ndarray, alpha: float, gain: float, y_before: float) -> np.ndarray:
    """The definition, one sample at a time."""
    out = np.empty(x.size)
    prev = y_before
    for i, v in enumerate(x):
        prev = alpha * prev + gain * v
        out[i] = prev
    return out


def _close(y: np.ndarray, ref: np.ndarray, rel: float = 1e-12) -> None:
    """Equal to ``rel`` of the output's scale (random signs make single values near 0)."""
    assert y.shape == ref.shape
    scale = float(np.abs(ref).max(initial=0.0))
    np.testing.assert_allclose(y, ref, rtol=0, atol=rel * scale)


# time constants in samples: from far shorter than a sample (alpha underflows towards 0) to
# far longer than the data (alpha → 1); sizes around the block lengths
TIME_CONSTANTS = [1e-3, 0.02, 0.1, 0.5, 2.0, 7.0, 60.0, 1e3, 1e5, 1e9]
SIZES = [2, 3, 9, 100, 1023, 1024, 1025, 4099]


@pytest.mark.parametrize("tc", TIME_CONSTANTS)
@pytest.mark.parametrize("n", SIZES)
def test_matches_the_sample_by_sample_recursion(tc: float, n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n) * 100 + 20
    alpha = math.exp(-1.0 / tc)
    _close(first_order_filter(x, alpha, 0.7, -3.0), _loop(x, alpha, 0.7, -3.0))


@pytest.mark.parametrize("tc", TIME_CONSTANTS)
def test_matches_lfilter_on_an_hour_at_1khz(tc: float) -> None:
    x = np.random.default_rng(7).uniform(80, 700, 3_600_000)
    alpha = math.exp(-1.0 / tc)
    ref = lfilter([1 - alpha], [1, -alpha], x, zi=[alpha * x[0]])[0]
    _close(first_order_filter(x, alpha, 1 - alpha, x[0]), ref)


def test_lengths_zero_and_one() -> None:
    assert first_order_filter(np.zeros(0), 0.5, 0.5, 3.0).shape == (0,)
    assert first_order_filter([2.0], 0.25, 0.5, 4.0).tolist() == [0.25 * 4.0 + 0.5 * 2.0]


def test_edge_coefficients() -> None:
    x = np.random.default_rng(1).standard_normal(5000)
    # alpha 0: no memory; alpha 1: a running sum from y_before
    assert np.array_equal(first_order_filter(x, 0.0, 2.0, 9.0), 2.0 * x)
    _close(first_order_filter(x, 1.0, 1.0, 5.0), 5.0 + np.cumsum(x))
    # the smallest positive alpha: the previous output still counts (x[1] == 0 below)
    tiny = 5e-324
    y = first_order_filter([1e300, 0.0], tiny, 1.0, 0.0)
    assert y[1] == tiny * 1e300


def test_settled_low_pass_keeps_a_constant_and_the_input_is_untouched() -> None:
    x = np.full(10_000, 42.0)
    for alpha in (1e-9, 0.5, 0.999999):
        np.testing.assert_allclose(first_order_filter(x, alpha, 1 - alpha, x[0]), 42.0,
                                   rtol=1e-12)
    assert np.all(x == 42.0)


def test_large_values_do_not_overflow() -> None:
    x = np.random.default_rng(2).uniform(-1, 1, 50_000) * 1e280
    for tc in (0.05, 1.0, 1e4):
        alpha = math.exp(-1.0 / tc)
        y = first_order_filter(x, alpha, 1 - alpha, 0.0)
        assert np.all(np.isfinite(y))
        _close(y, lfilter([1 - alpha], [1, -alpha], x, zi=[0.0])[0])


@pytest.mark.parametrize("alpha", [-0.1, 1.5, math.nan])
def test_alpha_outside_zero_one_is_refused(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        first_order_filter([1.0, 2.0], alpha, 1.0, 0.0)
