"""Gradient boosting with small regression trees, on numpy only, plus a per-workload offset.

Why our own: the project does not depend on scikit-learn, and the model GPOEO-style sweeps
need is small: log(time) or log(power) = a_w + g(setting, workload features), where a_w is
each workload's level (estimated from its own rows) and g is a shape shared by all
workloads, learned by boosting depth-limited trees on histogram splits (≤ 32 bins a feature).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass
class _Tree:
    """Nodes as arrays: feature (-1 for a leaf), threshold, children, leaf value."""

    feature: list[int] = field(default_factory=list)
    threshold: list[float] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    right: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)

    def predict(self, x: FloatArray) -> FloatArray:
        out = np.empty(x.shape[0])
        node = np.zeros(x.shape[0], dtype=np.int64)
        feature = np.array(self.feature)
        threshold = np.array(self.threshold)
        left, right, value = np.array(self.left), np.array(self.right), np.array(self.value)
        active = feature[node] >= 0
        while np.any(active):
            idx = np.flatnonzero(active)
            f = feature[node[idx]]
            go_left = x[idx, f] <= threshold[node[idx]]
            node[idx] = np.where(go_left, left[node[idx]], right[node[idx]])
            active = feature[node] >= 0
        out[:] = value[node]
        return out


def _thresholds(column: FloatArray, max_bins: int) -> FloatArray:
    """Candidate split points: midpoints between distinct values, thinned to ``max_bins``."""
    u = np.unique(column[np.isfinite(column)])
    if u.shape[0] < 2:
        return np.zeros(0)
    mids = 0.5 * (u[1:] + u[:-1])
    if mids.shape[0] > max_bins:
        mids = mids[np.linspace(0, mids.shape[0] - 1, max_bins).round().astype(np.int64)]
    return np.unique(mids)


class BoostedCurves:
    """log y = a_w + g(features): boosted trees for the shared shape g, means for a_w."""

    def __init__(self, *, n_trees: int = 60, depth: int = 3, learning_rate: float = 0.15,
                 min_leaf: int = 3, max_bins: int = 32, rounds: int = 3) -> None:
        self.n_trees = n_trees
        self.depth = depth
        self.learning_rate = learning_rate
        self.min_leaf = min_leaf
        self.max_bins = max_bins
        self.rounds = rounds
        self.trees: list[_Tree] = []
        self.offset: dict[int, float] = {}
        self.base = 0.0

    def fit(self, x: FloatArray, group: IntArray, y: FloatArray) -> BoostedCurves:
        """Fit on features ``x`` (n × f, NaN allowed), workload ids ``group`` and log values."""
        x = np.where(np.isfinite(x), x, -1e300)
        thresholds = [_thresholds(x[:, j], self.max_bins) for j in range(x.shape[1])]
        codes = np.column_stack([np.searchsorted(t, x[:, j], side="left")
                                 for j, t in enumerate(thresholds)]).astype(np.int64)
        width = max(t.shape[0] for t in thresholds) + 1
        self._width = width
        self._flat = codes + np.arange(codes.shape[1]) * width  # one bincount for all features
        bins = np.array([t.shape[0] for t in thresholds])
        self._valid = np.arange(width)[None, :] < bins[:, None]
        groups, inverse = np.unique(group, return_inverse=True)
        g = np.zeros(y.shape[0])
        self.trees = []
        per_round = max(1, self.n_trees // self.rounds)
        for _ in range(self.rounds):
            level = np.bincount(inverse, weights=y - g) / np.bincount(inverse)
            r_base = y - level[inverse]
            for _ in range(per_round):
                tree = _Tree()
                step = np.zeros(y.shape[0])
                self._node(tree, codes, thresholds, r_base - g, np.arange(y.shape[0]),
                           depth=0, step=step)
                self.trees.append(tree)
                g += step
        level = np.bincount(inverse, weights=y - g) / np.bincount(inverse)
        self.offset = {int(k): float(v) for k, v in zip(groups, level, strict=True)}
        self.base = float(np.mean(level))
        return self

    def predict(self, x: FloatArray, group: IntArray) -> FloatArray:
        """Predicted log values; an unseen workload gets the mean level."""
        x = np.where(np.isfinite(x), x, -1e300)
        shape = np.zeros(x.shape[0])
        for tree in self.trees:
            shape += tree.predict(x)
        level = np.array([self.offset.get(int(k), self.base) for k in group])
        return np.asarray(level + shape, dtype=np.float64)

    def _node(self, tree: _Tree, codes: IntArray, thresholds: list[FloatArray], r: FloatArray,
              idx: IntArray, *, depth: int, step: FloatArray) -> int:
        me = len(tree.feature)
        value = self.learning_rate * float(np.mean(r[idx]))
        tree.feature.append(-1)
        tree.threshold.append(0.0)
        tree.left.append(-1)
        tree.right.append(-1)
        tree.value.append(value)
        best = None
        if depth < self.depth and idx.shape[0] >= 2 * self.min_leaf:
            best = self._best_split(idx, r[idx])
        if best is None:
            step[idx] = value
            return me
        feature, j = best
        go_left = codes[idx, feature] <= j
        tree.feature[me] = feature
        tree.threshold[me] = float(thresholds[feature][j])
        tree.left[me] = self._node(tree, codes, thresholds, r, idx[go_left],
                                   depth=depth + 1, step=step)
        tree.right[me] = self._node(tree, codes, thresholds, r, idx[~go_left],
                                    depth=depth + 1, step=step)
        return me

    def _best_split(self, idx: IntArray, r: FloatArray) -> tuple[int, int] | None:
        """Best (feature, bin) by squared-error gain, every feature in one histogram."""
        n = r.shape[0]
        flat = self._flat[idx]
        n_feat, width = self._valid.shape
        size = n_feat * width
        weights = np.broadcast_to(r[:, None], flat.shape).ravel()
        s = np.cumsum(np.bincount(flat.ravel(), weights=weights, minlength=size)
                      .reshape(n_feat, width), axis=1)
        c = np.cumsum(np.bincount(flat.ravel(), minlength=size).reshape(n_feat, width), axis=1)
        total = float(r.sum())
        ok = self._valid & (c >= self.min_leaf) & (n - c >= self.min_leaf)
        if not np.any(ok):
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(ok, s * s / c + (total - s) ** 2 / (n - c), -np.inf)
        best = int(np.argmax(gain))
        if gain.flat[best] <= total * total / n + 1e-12:
            return None
        return best // width, best % width
