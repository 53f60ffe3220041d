"""Energy models: time(x) and power(x) per workload, hence energy and EDP, chosen by LOO.

Why several families: the seed thesis fitted simple regressions per GPU; real curves bend
(time explodes under a low power limit, power saturates at a high one), so we also fit
monotone piecewise (isotonic, PCHIP) and smoothing-spline curves, and a boosted model that
shares the curve shape across workloads (GPOEO-style, with workload features; its number of
trees chosen by the same cross-validation, since too few pool every workload into one
shape). Which one
to trust is decided by leave-one-out cross-validation (every row held out once, the family
refitted without it), never hard-coded: the family with the lowest LOO MAPE of the
objective's quantity is used for the recommendation, and its LOO residuals give the
interval of the predicted saving.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.interpolate import PchipInterpolator, make_smoothing_spline

from wattlab.analysis.models.boosting import BoostedCurves
from wattlab.analysis.models.sweep_results import SweepTable
from wattlab.errors import UsageError

FloatArray = npt.NDArray[np.float64]
Curve = Callable[[FloatArray], FloatArray]
FitFn = Callable[[FloatArray, FloatArray], Curve | None]

OBJECTIVES = ("energy", "edp", "time")
PER_WORKLOAD = ("linear", "quadratic", "inverse", "isotonic", "pchip", "spline")
FAMILIES = (*PER_WORKLOAD, "boosted")
QUANTITIES = ("time", "power", "energy", "edp")
MIN_SPLINE_POINTS = 5
BOOST_MIN_WORKLOADS = 3
MAX_BOOST_HOLDOUT = 500  # boosted LOO cost: rows × held-out rows; 500 covers the Zeus traces


# --------------------------------------------------------------------------- one curve


def _unique_mean(x: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Repeats averaged: (distinct x ascending, mean y, count)."""
    xu, inv = np.unique(x, return_inverse=True)
    n = np.bincount(inv).astype(np.float64)
    return xu, np.bincount(inv, weights=y) / n, n


def _poly(degree: int) -> FitFn:
    def fit(x: FloatArray, y: FloatArray) -> Curve | None:
        xu = np.unique(x)
        if xu.shape[0] <= degree:
            return None
        scale = float(np.max(np.abs(xu)))
        coef = np.polyfit(x / scale, y, degree)
        return lambda q: np.asarray(np.polyval(coef, q / scale), dtype=np.float64)

    return fit


def _inverse(x: FloatArray, y: FloatArray) -> Curve | None:
    """Y = a + b/x: runtime of work done at a rate proportional to the setting."""
    if np.unique(x).shape[0] < 2 or np.any(x <= 0):
        return None
    scale = float(np.max(x))
    a = np.column_stack([np.ones_like(x), scale / x])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return lambda q: np.asarray(coef[0] + coef[1] * scale / q, dtype=np.float64)


def _pava(y: FloatArray, w: FloatArray) -> FloatArray:
    """Pool-adjacent-violators: the non-decreasing least-squares fit."""
    vals: list[float] = []
    wts: list[float] = []
    sizes: list[int] = []
    for yi, wi in zip(y.tolist(), w.tolist(), strict=True):
        vals.append(yi)
        wts.append(wi)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            wsum = wts[-2] + wts[-1]
            vals[-2] = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / wsum
            wts[-2] = wsum
            sizes[-2] += sizes[-1]
            del vals[-1], wts[-1], sizes[-1]
    return np.repeat(vals, sizes)


def _isotonic(x: FloatArray, y: FloatArray) -> Curve | None:
    """Monotone (direction from the data's trend), linear between points, flat outside."""
    xu, yu, n = _unique_mean(x, y)
    if xu.shape[0] < 2:
        return None
    sign = 1.0 if np.polyfit(xu, yu, 1)[0] >= 0 else -1.0
    fitted = sign * _pava(sign * yu, n)
    return lambda q: np.asarray(np.interp(q, xu, fitted), dtype=np.float64)


def _linear_ends(f: Callable[[FloatArray], Any], df: Callable[[FloatArray], Any],
                 lo: float, hi: float) -> Curve:
    """A curve extrapolated along its end tangents (cubic extrapolation overshoots)."""
    def curve(q: FloatArray) -> FloatArray:
        q = np.asarray(q, dtype=np.float64)
        inside = np.clip(q, lo, hi)
        out = np.asarray(f(inside), dtype=np.float64)
        out = np.where(q < lo, out + df(np.array(lo)) * (q - lo), out)
        return np.asarray(np.where(q > hi, out + df(np.array(hi)) * (q - hi), out))

    return curve


def _pchip(x: FloatArray, y: FloatArray) -> Curve | None:
    """Monotone piecewise-cubic interpolation through the (averaged) points."""
    xu, yu, _ = _unique_mean(x, y)
    if xu.shape[0] < 2:
        return None
    p = PchipInterpolator(xu, yu)
    return _linear_ends(p, p.derivative(), float(xu[0]), float(xu[-1]))


def _spline(x: FloatArray, y: FloatArray) -> Curve | None:
    """Cubic smoothing spline, smoothness chosen by generalised cross-validation."""
    xu, yu, n = _unique_mean(x, y)
    if xu.shape[0] < MIN_SPLINE_POINTS:
        return None
    try:
        s = make_smoothing_spline(xu, yu, w=n)
    except (ValueError, np.linalg.LinAlgError):
        return None
    return _linear_ends(s, s.derivative(), float(xu[0]), float(xu[-1]))


CURVE_FITS: dict[str, FitFn] = {
    "linear": _poly(1),
    "quadratic": _poly(2),
    "inverse": _inverse,
    "isotonic": _isotonic,
    "pchip": _pchip,
    "spline": _spline,
}


# --------------------------------------------------------------------------- fits


@dataclass
class _Data:
    """The table as model inputs: x, time, power, workload ids, feature matrix."""

    x: FloatArray
    time_s: FloatArray
    power_w: FloatArray
    group: npt.NDArray[np.int64]
    names: list[str]
    features: FloatArray
    rows: list[npt.NDArray[np.int64]]

    @classmethod
    def of(cls, table: SweepTable) -> _Data:
        names = table.workloads()
        index = {w: i for i, w in enumerate(names)}
        group = np.array([index[w] for w in table.workload], dtype=np.int64)
        x = table.x
        span = float(np.nanmax(x)) if len(x) else 1.0
        cols = [x / span] + [np.asarray(v, dtype=np.float64) for v in table.features.values()]
        return cls(x, table.runtime_s, table.mean_power_w, group, names, np.column_stack(cols),
                   [np.flatnonzero(group == g) for g in range(len(names))])


def _predict_curves(family: str, d: _Data, train: npt.NDArray[np.int64], query: FloatArray,
                    ) -> tuple[FloatArray, FloatArray] | None:
    """(time, power) at ``query`` from a per-workload family fitted on rows ``train``."""
    fit = CURVE_FITS[family]
    t_curve = fit(d.x[train], d.time_s[train])
    p_curve = fit(d.x[train], d.power_w[train])
    if t_curve is None or p_curve is None:
        return None
    return t_curve(query), p_curve(query)


def _fit_boosted(d: _Data, boost: dict[str, Any], trees: tuple[int, int],
                 train: npt.NDArray[np.int64] | None = None,
                 ) -> tuple[BoostedCurves, BoostedCurves]:
    """Time and power models on rows ``train`` (all), with the tree counts chosen by LOO."""
    rows = np.arange(d.x.shape[0]) if train is None else train
    models = []
    for y, n_trees in ((d.time_s, trees[0]), (d.power_w, trees[1])):
        model = BoostedCurves(**{**boost, "n_trees": n_trees})
        models.append(model.fit(d.features[rows], d.group[rows], np.log(y[rows])))
    return models[0], models[1]


def _floor(v: FloatArray, ref: FloatArray) -> FloatArray:
    """Keep predictions physical: a curve extrapolated below zero becomes a tiny positive."""
    return np.maximum(v, 1e-3 * np.abs(ref).min(initial=1.0))


# --------------------------------------------------------------------------- LOO


@dataclass
class FamilyScore:
    """LOO result of one family: MAPE (%) per quantity on the rows it could predict."""

    family: str
    n_heldout: int
    n_predicted: int
    mape: dict[str, float]
    mape_common: dict[str, float] = field(default_factory=dict)
    trees: tuple[int, int] | None = None  # boosted: (time, power) tree counts chosen by LOO

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _quantities(t: FloatArray, p: FloatArray) -> dict[str, FloatArray]:
    return {"time": t, "power": p, "energy": t * p, "edp": t * t * p}


@dataclass
class LooPrediction:
    """Held-out predictions of one family: time, power (NaN: not predicted), rows held out."""

    time_s: FloatArray
    power_w: FloatArray
    held: npt.NDArray[np.bool_]
    trees: tuple[int, int] | None = None  # boosted: (time, power) tree counts chosen by LOO


def loo_predictions(table: SweepTable, families: tuple[str, ...] = FAMILIES,
                    max_boost_holdout: int = MAX_BOOST_HOLDOUT,
                    boost: dict[str, Any] | None = None) -> dict[str, LooPrediction]:
    """Held-out (time, power) per row for each family; NaN where a family cannot predict.

    Per-workload families are refitted on the other rows of the held-out row's workload.
    The boosted family is refitted on every other row of the table (all refits grown
    together, see ``BoostedCurves.loo``), with its tree count chosen by the same LOO; the
    cost grows with rows × held-out rows, so at most ``max_boost_holdout`` rows (evenly
    spread) are held out for it.
    """
    d = _Data.of(table)
    out: dict[str, LooPrediction] = {}
    for family in families:
        if family == "boosted":
            out[family] = _loo_boosted(d, max_boost_holdout, boost or {})
        else:
            out[family] = _loo_curves(family, d)
    return out


def _loo_curves(family: str, d: _Data) -> LooPrediction:
    """Each row predicted by the family refitted on the other rows of its workload."""
    n = d.x.shape[0]
    t_hat, p_hat = np.full(n, np.nan), np.full(n, np.nan)
    for rows in d.rows:
        for k, i in enumerate(rows):
            pred = _predict_curves(family, d, np.delete(rows, k), d.x[i:i + 1])
            if pred is not None:
                t_hat[i] = _floor(pred[0], d.time_s[rows])[0]
                p_hat[i] = _floor(pred[1], d.power_w[rows])[0]
    return LooPrediction(t_hat, p_hat, np.ones(n, dtype=bool))


def _loo_boosted(d: _Data, max_holdout: int, boost: dict[str, Any]) -> LooPrediction:
    """Up to ``max_holdout`` rows (evenly spread), each predicted by a refit on all others."""
    n = d.x.shape[0]
    t_hat, p_hat = np.full(n, np.nan), np.full(n, np.nan)
    held = np.zeros(n, dtype=bool)
    if len(d.names) < BOOST_MIN_WORKLOADS:
        return LooPrediction(t_hat, p_hat, held)
    picks = np.unique(np.linspace(0, n - 1, min(n, max_holdout)).round().astype(np.int64))
    held[picks] = True
    model = BoostedCurves(**boost)
    log_t, t_trees = model.loo(d.features, d.group, np.log(d.time_s), picks)
    log_p, p_trees = model.loo(d.features, d.group, np.log(d.power_w), picks)
    t_hat[picks], p_hat[picks] = np.exp(log_t), np.exp(log_p)
    return LooPrediction(t_hat, p_hat, held, (t_trees, p_trees))


def _mape(pred: FloatArray, true: FloatArray, mask: npt.NDArray[np.bool_]) -> float:
    if not np.any(mask):
        return float("nan")
    return float(100.0 * np.mean(np.abs(pred[mask] - true[mask]) / np.abs(true[mask])))


def score_families(table: SweepTable, preds: dict[str, LooPrediction]) -> list[FamilyScore]:
    """MAPE per family and quantity, and ``mape_common`` (used to choose).

    ``mape_common`` is computed on the rows every competing family predicted: the boosted
    family may hold out only a subset, and families must be compared on the same rows.
    """
    true = _quantities(table.runtime_s, table.mean_power_w)
    done = {f: np.isfinite(lp.time_s) & np.isfinite(lp.power_w) for f, lp in preds.items()}
    complete = [done[f] for f, lp in preds.items()
                if np.any(done[f]) and np.array_equal(done[f], lp.held)]
    common = np.logical_and.reduce(complete) if complete else np.zeros(len(table), dtype=bool)
    scores = []
    for family, lp in preds.items():
        q = _quantities(lp.time_s, lp.power_w)
        scores.append(FamilyScore(
            family, int(np.sum(lp.held)), int(np.sum(done[family])),
            {k: _mape(q[k], true[k], done[family]) for k in QUANTITIES},
            {k: _mape(q[k], true[k], common & done[family]) for k in QUANTITIES}, lp.trees,
        ))
    return scores


def choose_family(scores: list[FamilyScore], objective: str) -> FamilyScore:
    """The family with the lowest LOO MAPE of the objective's quantity on the common rows.

    Only families that predicted every row they held out compete, so a family is never
    preferred for skipping the hard rows.
    """
    quantity = _objective_quantity(objective)
    ok = [s for s in scores if s.n_predicted == s.n_heldout and s.n_predicted > 0
          and np.isfinite(s.mape_common.get(quantity, np.nan))]
    if not ok:
        raise UsageError("no model family could be cross-validated: each workload needs at "
                         "least 3 rows at 2 or more settings")
    return min(ok, key=lambda s: s.mape_common[quantity])


def _objective_quantity(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise UsageError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    return objective


# --------------------------------------------------------------------------- recommend


@dataclass
class Recommendation:
    """The best setting of one workload for the objective under the slowdown bound."""

    workload: str
    default_x: float
    recommended_x: float
    predicted_slowdown: float
    predicted_saving: float
    saving_interval: tuple[float, float]
    measured_best_x: float
    measured_saving: float | None
    settings: list[float]
    predicted_objective: list[float]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FitReport:
    """Everything ``wattlab fit`` prints: LOO scores, the chosen family, recommendations."""

    origin: str
    x_name: str
    objective: str
    max_slowdown: float | None
    families: list[FamilyScore]
    chosen: str
    recommendations: list[Recommendation]
    n_rows: int
    n_workloads: int

    @property
    def agreement(self) -> float:
        """Fraction of workloads whose recommended setting is the measured best."""
        if not self.recommendations:
            return float("nan")
        hits = [r.recommended_x == r.measured_best_x for r in self.recommendations]
        return float(np.mean(hits))

    def to_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin, "x_name": self.x_name, "objective": self.objective,
            "max_slowdown": self.max_slowdown, "n_rows": self.n_rows,
            "n_workloads": self.n_workloads, "chosen_family": self.chosen,
            "families": [s.to_json() for s in self.families],
            "agreement_with_measured_best": self.agreement,
            "recommendations": [r.to_json() for r in self.recommendations],
        }


def _objective(objective: str, t: FloatArray, p: FloatArray) -> FloatArray:
    return {"energy": t * p, "edp": t * t * p, "time": t}[objective]


def _best(settings: FloatArray, t: FloatArray, obj: FloatArray, ref: int,
          max_slowdown: float | None) -> int:
    """Index of the lowest objective whose time is within the bound of the default's."""
    feasible = np.ones(settings.shape[0], dtype=bool)
    if max_slowdown is not None:
        feasible = t <= t[ref] * (1.0 + max_slowdown) + 1e-12
    feasible[ref] = True
    return int(np.flatnonzero(feasible)[np.argmin(obj[feasible])])


def recommend(table: SweepTable, family: str, objective: str, max_slowdown: float | None,
              residuals: FloatArray, *, boost: dict[str, Any] | None = None,
              trees: tuple[int, int] | None = None, seed: int = 0) -> list[Recommendation]:
    """Per workload: fit ``family`` on all its rows, pick the best measured setting.

    The saving interval (95 %) bootstraps the family's LOO ratios measured/predicted of the
    objective's quantity (``residuals``) at both settings, so it is as wide as the model's
    real error; ``fit_sweep`` passes the ratios of interior rows, where LOO interpolates.
    The boosted family uses ``trees`` (time, power), the counts its LOO chose.
    """
    d = _Data.of(table)
    rng = np.random.default_rng(seed)
    boosted = None
    if family == "boosted":
        cap = BoostedCurves(**(boost or {})).n_trees
        boosted = _fit_boosted(d, boost or {}, trees or (cap, cap))
    out: list[Recommendation] = []
    ratios = residuals[np.isfinite(residuals) & (residuals > 0)]
    if ratios.shape[0] == 0:
        ratios = np.ones(1)
    for g, rows in enumerate(d.rows):
        settings = np.unique(d.x[rows])
        default = float(settings.max())
        if table.default_x is not None and table.default_x in settings:
            default = table.default_x
        ref = int(np.flatnonzero(settings == default)[0])
        if boosted is not None:
            feats = np.repeat(d.features[rows[:1]], settings.shape[0], axis=0)
            feats[:, 0] = settings / float(np.nanmax(d.x))
            group = np.full(settings.shape[0], g)
            t = np.exp(boosted[0].predict(feats, group))
            p = np.exp(boosted[1].predict(feats, group))
        else:
            pred = _predict_curves(family, d, rows, settings)
            if pred is None:
                continue
            t, p = _floor(pred[0], d.time_s[rows]), _floor(pred[1], d.power_w[rows])
        obj = _objective(objective, t, p)
        best = _best(settings, t, obj, ref, max_slowdown)
        saving = 1.0 - obj[best] / obj[ref]
        draws = rng.choice(ratios, size=(2000, 2))
        boot = 1.0 - obj[best] * draws[:, 0] / (obj[ref] * draws[:, 1])
        lo, hi = np.percentile(boot, [2.5, 97.5])
        xu, t_meas, _ = _unique_mean(d.x[rows], d.time_s[rows])
        _, e_meas, _ = _unique_mean(d.x[rows], d.time_s[rows] * d.power_w[rows])
        obj_meas = _objective(objective, t_meas, e_meas / t_meas)
        ref_m = int(np.flatnonzero(xu == default)[0])
        best_m = _best(xu, t_meas, obj_meas, ref_m, max_slowdown)
        at = np.flatnonzero(xu == settings[best])
        measured = float(1.0 - obj_meas[at[0]] / obj_meas[ref_m]) if at.size else None
        out.append(Recommendation(
            d.names[g], float(default), float(settings[best]), float(t[best] / t[ref] - 1.0),
            float(saving), (float(lo), float(hi)), float(xu[best_m]), measured,
            settings.tolist(), obj.tolist()))
    return out


def unseen_workload_picks(table: SweepTable, objective: str, trees: tuple[int, int],
                          boost: dict[str, Any] | None = None) -> dict[str, float]:
    """Per workload: the boosted family's best setting, fitted on the *other* workloads only.

    Why: a pick from a fit on the workload's own runs agrees with their measured argmin
    partly by reproducing their noise; a model that never saw the workload cannot, so this
    is the out-of-sample check of the pick. (Its unknown level a_w cancels in the argmin.)
    """
    d = _Data.of(table)
    if len(d.names) < BOOST_MIN_WORKLOADS:
        raise UsageError(f"the boosted family needs {BOOST_MIN_WORKLOADS} workloads")
    out = {}
    for g, rows in enumerate(d.rows):
        tm, pm = _fit_boosted(d, boost or {}, trees, np.flatnonzero(d.group != g))
        t = np.exp(tm.predict(d.features[rows], d.group[rows]))
        p = np.exp(pm.predict(d.features[rows], d.group[rows]))
        out[d.names[g]] = float(d.x[rows][np.argmin(_objective(objective, t, p))])
    return out


def _interior(table: SweepTable) -> npt.NDArray[np.bool_]:
    """Rows strictly inside their workload's setting range (LOO there interpolates)."""
    out = np.zeros(len(table), dtype=bool)
    names = np.array(table.workload, dtype=object)
    for w in table.workloads():
        rows = np.flatnonzero(names == w)
        x = table.x[rows]
        out[rows] = (x > x.min()) & (x < x.max())
    return out


def fit_sweep(table: SweepTable, objective: str = "energy", max_slowdown: float | None = None,
              *, families: tuple[str, ...] = FAMILIES,
              max_boost_holdout: int = MAX_BOOST_HOLDOUT,
              boost: dict[str, Any] | None = None,
              loo: dict[str, LooPrediction] | None = None) -> FitReport:
    """Cross-validate every family, choose by LOO MAPE, recommend a setting per workload.

    ``loo``: held-out predictions of ``table.usable()`` already made by ``loo_predictions``
    (they do not depend on the objective), to fit several objectives without refitting.
    """
    quantity = _objective_quantity(objective)
    if max_slowdown is not None and max_slowdown < 0:
        raise UsageError(f"--max-slowdown must be >= 0, got {max_slowdown}")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise UsageError(f"unknown model famil{'ies' if len(unknown) > 1 else 'y'} "
                         f"{', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    data = table.usable()
    if len(data) == 0:
        raise UsageError(f"{table.origin}: no finished runs with positive time and energy")
    preds = loo if loo is not None else loo_predictions(data, families, max_boost_holdout,
                                                         boost)
    scores = score_families(data, preds)
    chosen = choose_family(scores, objective)
    t_hat, p_hat = preds[chosen.family].time_s, preds[chosen.family].power_w
    true = _quantities(data.runtime_s, data.mean_power_w)[quantity]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = true / _quantities(t_hat, p_hat)[quantity]
    interior = _interior(data)
    if np.sum(interior & np.isfinite(ratios)) >= 5:
        ratios = ratios[interior]  # recommendations use measured settings, not extrapolation
    recs = recommend(data, chosen.family, objective, max_slowdown, ratios, boost=boost,
                     trees=preds[chosen.family].trees)
    return FitReport(table.origin, data.x_name, objective, max_slowdown, scores,
                     chosen.family, recs, len(data), len(data.workloads()))
