"""Information-weighted batch means: the weights are least squares' own, and they matter."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wattlab.analysis.calibration.batch_means import linear_information, weighted_batch_se

pytestmark = pytest.mark.fast


def test_information_is_the_inverse_of_the_normal_matrix_diagonal() -> None:
    m = np.random.default_rng(1).uniform(100, 600, 50)
    normal_inv = np.linalg.inv(np.column_stack([m, np.ones_like(m)]).T
                               @ np.column_stack([m, np.ones_like(m)]))
    gain_info, offset_info = linear_information(m, np.zeros_like(m))
    assert gain_info == pytest.approx(1 / normal_inv[0, 0], rel=1e-9)
    assert offset_info == pytest.approx(1 / normal_inv[1, 1], rel=1e-9)


def test_information_skips_missing_points_and_refuses_a_constant_block() -> None:
    m = np.array([1.0, 2.0, np.nan, 3.0])
    y = np.array([0.0, np.nan, 1.0, 1.0])
    assert linear_information(m, y)[0] == pytest.approx(2.0)  # points 1 and 3 remain
    assert all(math.isnan(v) for v in linear_information(np.full(5, 300.0), np.zeros(5)))
    assert all(math.isnan(v) for v in linear_information(np.array([1.0]), np.array([1.0])))


def test_equal_weights_give_the_plain_standard_error_of_the_mean() -> None:
    x = np.random.default_rng(2).normal(1.0, 0.01, 8)
    expected = float(np.std(x, ddof=1) / math.sqrt(x.size))
    assert weighted_batch_se(x, np.full(8, 3.0)) == pytest.approx(expected, rel=1e-12)


def test_a_block_that_knows_little_barely_moves_the_error() -> None:
    x = np.array([0.999, 1.001, 1.000, 0.998, 1.002, 1.000, 0.999, 1.001])
    w = np.full(8, 1e5)
    base = weighted_batch_se(x, w)
    x_wild, w_wild = x.copy(), w.copy()
    x_wild[3], w_wild[3] = 0.83, 2e3  # a quiet stretch's fit: far off, 50 times less sure
    assert weighted_batch_se(x_wild, w_wild) < 3 * base
    assert weighted_batch_se(x_wild, np.ones(8)) > 10 * base  # what plain batch means gave


def test_fewer_than_three_usable_blocks_give_no_error() -> None:
    x = np.array([1.0, 1.1, np.nan, 0.9])
    assert math.isnan(weighted_batch_se(x, np.array([1.0, 1.0, 1.0, 0.0])))
    assert math.isnan(weighted_batch_se(x[:2], np.ones(2)))
    assert weighted_batch_se(x, np.ones(4)) > 0
