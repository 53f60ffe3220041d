"""The own minimisers: known minima, tolerances honoured, bounds never left."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize, minimize_scalar

from wattlab.analysis.calibration.minimise import golden_section, nelder_mead

pytestmark = pytest.mark.fast


def _rosenbrock(p: np.ndarray) -> float:
    return float(100 * (p[1] - p[0] ** 2) ** 2 + (1 - p[0]) ** 2)


def _simplex(p0: list[float], step: float) -> list[np.ndarray]:
    p = np.array(p0, dtype=np.float64)
    return [p, *(p + step * e for e in np.eye(p.size))]


def test_nelder_mead_finds_the_rosenbrock_minimum() -> None:
    x, fx = nelder_mead(_rosenbrock, _simplex([-1.2, 1.0], 0.1), xatol=1e-10, fatol=1e-14,
                        maxiter=5000)
    np.testing.assert_allclose(x, [1.0, 1.0], atol=1e-7)
    assert fx < 1e-14


def test_nelder_mead_in_four_dimensions_and_as_scipy_does() -> None:
    centre = np.array([0.3, -2.0, 5.0, 1.5])
    scale = np.array([1.0, 4.0, 0.5, 2.0])

    def f(p: np.ndarray) -> float:
        return float(((p - centre) ** 2 * scale).sum() + 7.0)

    simplex = _simplex([0.0, 0.0, 0.0, 0.0], 0.5)
    x, fx = nelder_mead(f, simplex, xatol=1e-8, fatol=1e-12, maxiter=4000)
    np.testing.assert_allclose(x, centre, atol=1e-6)
    assert fx == pytest.approx(7.0, abs=1e-11)
    theirs = minimize(f, simplex[0], method="Nelder-Mead",
                      options={"xatol": 1e-8, "fatol": 1e-12, "maxiter": 4000,
                               "initial_simplex": simplex})
    np.testing.assert_allclose(x, theirs.x, atol=1e-6)


@pytest.mark.parametrize("xatol", [1e-2, 1e-4, 1e-6])
def test_nelder_mead_stops_at_xatol(xatol: float) -> None:
    """A looser tolerance costs fewer evaluations; the answer is then within a few xatol."""
    calls = 0

    def f(p: np.ndarray) -> float:
        nonlocal calls
        calls += 1
        return float((p[0] - 0.25) ** 2 + 3 * (p[1] + 0.5) ** 2)

    x, _ = nelder_mead(f, _simplex([2.0, 2.0], 0.3), xatol=xatol, fatol=math.inf,
                       maxiter=1000)
    assert np.max(np.abs(x - [0.25, -0.5])) < 5 * xatol
    expected_calls = {1e-2: (10, 80), 1e-4: (40, 140), 1e-6: (70, 200)}[xatol]
    assert expected_calls[0] <= calls <= expected_calls[1]


def test_nelder_mead_honours_maxiter_and_fatol() -> None:
    calls = 0

    def f(p: np.ndarray) -> float:
        nonlocal calls
        calls += 1
        return _rosenbrock(p)

    nelder_mead(f, _simplex([-1.2, 1.0], 0.1), xatol=0.0, fatol=0.0, maxiter=7)
    assert calls <= 3 + 7 * 4  # start + per iteration at most reflect, contract, 2 shrinks
    counts = []
    for fatol in (1e-2, 1e-12):  # xatol never stops it: the values decide
        calls = 0
        _, fx = nelder_mead(f, _simplex([-1.2, 1.0], 0.1), xatol=math.inf, fatol=fatol,
                            maxiter=5000)
        counts.append(calls)
        assert fx < 0.1 if fatol == 1e-2 else fx < 1e-11
    assert counts[0] < counts[1]


@pytest.mark.parametrize("start", [[0.0, 0.0], [-1.0, 3.0], [-1.0, 0.0]])
def test_nelder_mead_treats_inf_as_outside(start: list[float]) -> None:
    """The calibration fit returns inf outside the allowed widths.

    From [-1, 0] the simplex collapses onto the edge x = 0.5 away from the minimum there
    (a known Nelder-Mead weakness, scipy's included): the same path as scipy's, step by step.
    """
    def f(p: np.ndarray) -> float:
        if p[0] > 0.5:
            return math.inf
        return float((p[0] - 1.0) ** 2 + (p[1] - 2.0) ** 2)

    simplex = _simplex(start, 0.2)
    x, fx = nelder_mead(f, simplex, xatol=1e-7, fatol=1e-12, maxiter=2000)
    assert x[0] <= 0.5 and math.isfinite(fx)
    if start != [-1.0, 0.0]:
        np.testing.assert_allclose(x, [0.5, 2.0], atol=1e-5)
    theirs = minimize(f, simplex[0], method="Nelder-Mead",
                      options={"xatol": 1e-7, "fatol": 1e-12, "maxiter": 2000,
                               "initial_simplex": simplex})
    np.testing.assert_allclose(x, theirs.x, atol=1e-9)


def test_nelder_mead_needs_n_plus_one_vertices() -> None:
    with pytest.raises(ValueError, match="vertices"):
        nelder_mead(_rosenbrock, [np.zeros(2), np.ones(2)], xatol=1e-3, fatol=1e-3,
                    maxiter=10)


@pytest.mark.parametrize(("centre", "xatol"), [(0.3, 1e-5), (-0.17, 1e-3), (0.2999, 1e-8)])
def test_golden_section_finds_an_interior_minimum_to_xatol(centre: float, xatol: float
                                                          ) -> None:
    seen: list[float] = []

    def f(x: float) -> float:
        seen.append(x)
        return abs(x - centre) ** 1.5  # not smooth at the minimum: no parabola helps

    x = golden_section(f, -0.3, 0.6, xatol=xatol)
    assert abs(x - centre) <= xatol
    assert all(-0.3 <= s <= 0.6 for s in seen)
    assert len(seen) <= math.ceil(math.log(0.9 / xatol) / math.log(1 / 0.618)) + 3


def test_golden_section_minimum_at_a_bound_and_an_empty_interval() -> None:
    assert abs(golden_section(lambda x: x, 2.0, 3.0, xatol=1e-6) - 2.0) <= 1e-6
    assert abs(golden_section(lambda x: -x, 2.0, 3.0, xatol=1e-6) - 3.0) <= 1e-6
    assert golden_section(lambda x: (x - 9) ** 2, 1.5, 1.5, xatol=1e-6) == 1.5
    with pytest.raises(ValueError, match="ordered"):
        golden_section(lambda x: x, 1.0, 0.0, xatol=1e-6)


def test_golden_section_ends_at_float_resolution() -> None:
    """An xatol below the spacing of floats near the bracket still ends (at that spacing)."""
    x = golden_section(lambda x: (x - 1e6 - 0.25) ** 2, 1e6, 1e6 + 1, xatol=0.0)
    assert abs(x - (1e6 + 0.25)) < 1e-9


def test_golden_section_agrees_with_scipy_bounded() -> None:
    rng = np.random.default_rng(5)
    t = np.linspace(0, 20, 2001)
    signal = np.sin(t) + 0.3 * np.sin(3.1 * t)

    def cost(d: float) -> float:  # as the energy-delay fit: shift one series onto another
        shifted = np.interp(t + d, t, signal)
        return float(np.mean((shifted - np.interp(t + 0.137, t, signal)) ** 2))

    for d0 in rng.uniform(0.0, 0.3, 5):
        ours = golden_section(cost, d0 - 0.3, d0 + 0.3, xatol=1e-5)
        theirs = minimize_scalar(cost, bounds=(d0 - 0.3, d0 + 0.3), method="bounded",
                                 options={"xatol": 1e-5}).x
        assert abs(ours - 0.137) < 2e-5
        assert abs(ours - theirs) < 3e-5
