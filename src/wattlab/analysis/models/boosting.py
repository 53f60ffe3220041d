"""Gradient boosting with small regression trees, on numpy only, plus a per-workload offset.

Why our own: the project does not depend on scikit-learn, and the model GPOEO-style sweeps
need is small: log(time) or log(power) = a_w + g(setting, workload features), where a_w is
each workload's level (estimated from its own rows) and g is a shape shared by all
workloads, learned by boosting depth-limited trees on histogram splits (≤ 32 bins a feature).

Why batched: leave-one-out refits the model once per row. Here M models, each with its
own 0/1 row weights, grow their trees together, level by level, every node of every model
from one histogram — so cross-validating every row costs a few numpy calls per level
instead of one Python tree per row. The levels a_w are re-estimated after every tree, so
the model after k trees is the one ``n_trees=k`` fits, and one leave-one-out run gives the
held-out error of every tree count: the count is chosen by it (too few trees pool the
workloads' curves into one shape, too many fit noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
MAX_KEYS = 1 << 21  # (model, row, feature) entries per batch of models: memory bound


def _thresholds(column: FloatArray, max_bins: int) -> FloatArray:
    """Candidate split points: midpoints between distinct values, thinned to ``max_bins``."""
    u = np.unique(column)
    if u.shape[0] < 2:
        return np.zeros(0)
    mids = 0.5 * (u[1:] + u[:-1])
    if mids.shape[0] > max_bins:
        mids = mids[np.linspace(0, mids.shape[0] - 1, max_bins).round().astype(np.int64)]
    return np.unique(mids)


def _sum(key: IntArray, weights: FloatArray, size: int) -> FloatArray:
    """Sum of ``weights`` per key in 0..size-1 (a histogram)."""
    return np.asarray(np.bincount(key, weights=weights, minlength=size), dtype=np.float64)


def _finite(x: FloatArray) -> FloatArray:
    """NaN features sort below every value (a missing feature is its own side of a split)."""
    return np.where(np.isfinite(x), x, -1e300)


@dataclass
class _Bins:
    """Features as bin codes: ``codes[i, j] <= b`` exactly when x[i, j] <= thresholds[j][b]."""

    thresholds: list[FloatArray]
    valid: BoolArray  # (feature, bin): bin b of feature j is a real split point

    @classmethod
    def of(cls, x: FloatArray, max_bins: int) -> _Bins:
        thresholds = [_thresholds(x[:, j], max_bins) for j in range(x.shape[1])]
        width = max(t.shape[0] for t in thresholds) + 1
        counts = np.array([t.shape[0] for t in thresholds])
        return cls(thresholds, np.arange(width)[None, :] < counts[:, None])

    def codes(self, x: FloatArray) -> IntArray:
        return np.column_stack([np.searchsorted(t, x[:, j], side="left")
                                for j, t in enumerate(self.thresholds)]).astype(np.int64)


@dataclass
class _Level:
    """One depth of one tree, for every model: per (model, node) the split or leaf value."""

    feature: IntArray  # (M, nodes); -1: the node is a leaf
    bin: IntArray
    value: FloatArray


@dataclass
class _Params:
    depth: int
    learning_rate: float
    min_leaf: int


class _Batch:
    """M boosted models on the same rows, each trained on the rows where its weight is 1."""

    def __init__(self, codes: IntArray, valid: BoolArray, weight: FloatArray,
                 params: _Params) -> None:
        self.codes = codes
        self.valid = valid
        self.weight = weight
        self.params = params
        self.columns = np.ascontiguousarray(codes.T)  # a feature's codes, contiguous

    def tree(self, r: FloatArray) -> tuple[list[_Level], FloatArray]:
        """One tree per model fitted to residuals ``r`` (M × n); its step on every row."""
        m, n = r.shape
        step = np.zeros((m, n))
        slot = np.zeros((m, n), dtype=np.int64)  # node within the level; -1: in a leaf
        levels = []
        for depth in range(self.params.depth + 1):
            nodes = 1 << depth
            sums, counts = self._totals(slot, r, nodes)
            value = self.params.learning_rate * np.divide(
                sums, counts, out=np.zeros_like(sums), where=counts > 0)
            feature, bins = (self._splits(slot, r, sums, counts) if depth < self.params.depth
                             else (np.full((m, nodes), -1), np.zeros((m, nodes), np.int64)))
            levels.append(_Level(feature, bins, value))
            slot = self._descend(slot, feature, bins, value, step)
            if np.all(slot < 0):
                break
        return levels, step

    def _totals(self, slot: IntArray, r: FloatArray, nodes: int) -> tuple[FloatArray, FloatArray]:
        """Weighted residual sum and row count per (model, node)."""
        m = slot.shape[0]
        key = (np.arange(m)[:, None] * nodes + np.maximum(slot, 0)).ravel()
        w = self.weight * (slot >= 0)
        size = m * nodes
        return (_sum(key, (w * r).ravel(), size).reshape(m, nodes),
                _sum(key, w.ravel(), size).reshape(m, nodes))

    def _histograms(self, slot: IntArray, r: FloatArray,
                    nodes: int) -> tuple[FloatArray, FloatArray]:
        """Cumulative residual sum and row count per (model × node, feature, bin)."""
        m, n = slot.shape
        n_feat, width = self.valid.shape
        train = np.flatnonzero(((slot >= 0) & (self.weight > 0)).ravel())
        node = (np.arange(m)[:, None] * nodes + slot).ravel()[train] * width
        row = train % n
        wr, w = (self.weight * r).ravel()[train], self.weight.ravel()[train]
        size = m * nodes * width
        s = np.empty((m * nodes, n_feat, width))
        c = np.empty((m * nodes, n_feat, width))
        for f in range(n_feat):
            key = node + self.columns[f][row]
            s[:, f] = _sum(key, wr, size).reshape(-1, width)
            c[:, f] = _sum(key, w, size).reshape(-1, width)
        return np.cumsum(s, axis=2), np.cumsum(c, axis=2)

    def _splits(self, slot: IntArray, r: FloatArray, sums: FloatArray,
                counts: FloatArray) -> tuple[IntArray, IntArray]:
        """Per (model, node): the (feature, bin) with the best squared-error gain, or -1."""
        m, nodes = sums.shape
        width = self.valid.shape[1]
        s, c = self._histograms(slot, r, nodes)
        n = counts.reshape(-1, 1, 1)
        total = sums.reshape(-1, 1, 1)
        leaf = self.params.min_leaf
        ok = self.valid[None] & (c >= leaf) & (n - c >= leaf)
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(ok, s * s / c + (total - s) ** 2 / (n - c), -np.inf)
            base = np.where(counts > 0, sums * sums / counts, np.inf).ravel() + 1e-12
        gain = gain.reshape(m * nodes, -1)
        best = np.argmax(gain, axis=1)
        split = gain[np.arange(m * nodes), best] > base
        feature = np.where(split, best // width, -1).reshape(m, nodes)
        return feature, (best % width).reshape(m, nodes)

    def _descend(self, slot: IntArray, feature: IntArray, bins: IntArray, value: FloatArray,
                 step: FloatArray) -> IntArray:
        """Rows in a leaf take its value (and leave); the others go to a child node."""
        live = slot >= 0
        at = np.maximum(slot, 0)
        f = np.take_along_axis(feature, at, axis=1)
        leaf = live & (f < 0)
        step += np.where(leaf, np.take_along_axis(value, at, axis=1), 0.0)
        code = self.codes[np.arange(slot.shape[1])[None, :], np.maximum(f, 0)]
        right = code > np.take_along_axis(bins, at, axis=1)
        return np.where(live & ~leaf, 2 * at + right, -1)


def _boost(batch: _Batch, inverse: IntArray, y: FloatArray, n_trees: int,
           held: IntArray | None = None) -> tuple[list[list[_Level]], FloatArray, FloatArray]:
    """Trees, workload levels (M × workloads) and the path of held-out values.

    ``held[m]`` is the row model m leaves out; the path (n_trees × M) is its value after
    each tree. Trees are kept only without ``held`` (one model: the one to predict with).
    """
    m = batch.weight.shape[0]
    n_groups = int(inverse.max()) + 1
    g = np.zeros((m, y.shape[0]))
    level = _levels(batch.weight, inverse, y, n_groups)
    trees = []
    path = np.zeros((n_trees, m)) if held is not None else np.zeros((0, m))
    for k in range(n_trees):
        tree, step = batch.tree(y - level[:, inverse] - g)
        g += step
        level = _levels(batch.weight, inverse, y - g, n_groups)
        if held is None:
            trees.append(tree)
        else:
            path[k] = level[np.arange(m), inverse[held]] + g[np.arange(m), held]
    return trees, level, path


def _levels(weight: FloatArray, inverse: IntArray, resid: FloatArray, n_groups: int,
            ) -> FloatArray:
    """Weighted mean residual per (model, workload); NaN where a model saw none of it."""
    m = weight.shape[0]
    key = (np.arange(m)[:, None] * n_groups + inverse).ravel()
    s = _sum(key, (weight * resid).ravel(), m * n_groups)
    c = _sum(key, weight.ravel(), m * n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (s / c).reshape(m, n_groups)


class BoostedCurves:
    """log y = a_w + g(features): boosted trees for the shared shape g, means for a_w."""

    def __init__(self, *, n_trees: int = 200, depth: int = 4, learning_rate: float = 0.3,
                 min_leaf: int = 3, max_bins: int = 32) -> None:
        self.n_trees = n_trees
        self.max_bins = max_bins
        self.params = _Params(depth, learning_rate, min_leaf)
        self.bins = _Bins([], np.zeros((0, 1), dtype=bool))
        self.trees: list[list[_Level]] = []
        self.offset: dict[int, float] = {}
        self.base = 0.0

    def fit(self, x: FloatArray, group: IntArray, y: FloatArray) -> BoostedCurves:
        """Fit on features ``x`` (n × f, NaN allowed), workload ids ``group`` and log values."""
        x = _finite(x)
        self.bins = _Bins.of(x, self.max_bins)
        groups, inverse = np.unique(group, return_inverse=True)
        batch = _Batch(self.bins.codes(x), self.bins.valid, np.ones((1, y.shape[0])),
                       self.params)
        self.trees, level, _ = _boost(batch, inverse, y, self.n_trees)
        self.offset = {int(k): float(v) for k, v in zip(groups, level[0], strict=True)}
        self.base = float(np.mean(level[0]))
        return self

    def predict(self, x: FloatArray, group: IntArray) -> FloatArray:
        """Predicted log values; an unseen workload gets the mean level."""
        codes = self.bins.codes(_finite(x))
        shape = np.zeros(x.shape[0])
        for tree in self.trees:
            shape += _route(tree, codes)
        level = np.array([self.offset.get(int(k), self.base) for k in group])
        return np.asarray(level + shape, dtype=np.float64)

    def loo(self, x: FloatArray, group: IntArray, y: FloatArray,
            held: IntArray) -> tuple[FloatArray, int]:
        """Held-out log values at rows ``held``, and the tree count best held out.

        Each row's value comes from a model fitted on all the other rows; the returned
        count (≤ ``n_trees``) has the lowest total held-out error. A row's own value uses
        the count best on the *other* held-out rows, so its error is not chosen on itself.
        Values are what ``fit`` on the other rows then ``predict`` give (split candidates
        come from every row's features, which are no targets: they differ only where the
        held-out row has a value no other row has). NaN where no other row is of the
        held-out row's workload.
        """
        path = self._loo_path(_finite(x), group, y, held)
        err = np.abs(path - y[held])
        ok = np.all(np.isfinite(err), axis=0)
        err = np.where(ok, err, 0.0)
        total = err.sum(axis=1)
        own = np.argmin(total[:, None] - err, axis=0)
        return path[own, np.arange(held.shape[0])], int(np.argmin(total)) + 1

    def _loo_path(self, x: FloatArray, group: IntArray, y: FloatArray,
                  held: IntArray) -> FloatArray:
        """Held-out value of each row of ``held`` after each tree (n_trees × held)."""
        bins = _Bins.of(x, self.max_bins)
        codes = bins.codes(x)
        _, inverse = np.unique(group, return_inverse=True)
        out = np.full((self.n_trees, held.shape[0]), np.nan)
        chunk = max(1, MAX_KEYS // (y.shape[0] * x.shape[1]))
        for start in range(0, held.shape[0], chunk):
            rows = held[start:start + chunk]
            weight = np.ones((rows.shape[0], y.shape[0]))
            weight[np.arange(rows.shape[0]), rows] = 0.0
            batch = _Batch(codes, bins.valid, weight, self.params)
            out[:, start:start + chunk] = _boost(batch, inverse, y, self.n_trees, rows)[2]
        return out


def _route(tree: list[_Level], codes: IntArray) -> FloatArray:
    """The value of the leaf each row (coded features) reaches in a one-model tree."""
    node = np.zeros(codes.shape[0], dtype=np.int64)
    out = np.zeros(codes.shape[0])
    live = np.ones(codes.shape[0], dtype=bool)
    for level in tree:
        f = level.feature[0, node]
        leaf = live & (f < 0)
        out[leaf] = level.value[0, node[leaf]]
        live &= ~leaf
        right = codes[np.arange(codes.shape[0]), np.maximum(f, 0)] > level.bin[0, node]
        node = np.where(live, 2 * node + right, 0)
    return out
