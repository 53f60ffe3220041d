"""A first-order recursive filter ``y[n] = alpha·y[n−1] + gain·x[n]`` in vectorised numpy.

Why not ``scipy.signal.lfilter``: importing scipy.signal costs about half a second, which is
a large share of ``wattlab calibrate`` on a long recording. The recursion is evaluated in
blocks: inside a block ``y[k] = alpha^k · Σ_{j≤k} alpha^−j · x[j]`` is a cumulative sum, and
each block's start is carried exactly from the previous block's end (itself the same
recursion over block ends, with ``alpha^L``). The block length keeps ``alpha^−j`` within
``LOG_RANGE`` (no overflow, however short the time constant); where that leaves blocks too
short to pay off, the recursion is a doubling scan, which ends once ``alpha^s`` underflows.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
MAX_BLOCK = 1024
"""Longest block: the rounding error of a cumulative sum grows with its length."""
MIN_BLOCK = 8
"""Shortest block worth a cumulative sum; a faster-decaying filter takes the doubling scan."""
LOG_RANGE = 50.0
"""Largest ``ln(alpha^−j)`` inside a block: alpha^−j ≤ e^50 ≈ 5e21, so that ``alpha^−j·x``
overflows only for |x| beyond ~1e286."""


def first_order_filter(x: npt.ArrayLike, alpha: float, gain: float, y_before: float
                       ) -> FloatArray:
    """``y[n] = alpha·y[n−1] + gain·x[n]`` with ``y[−1] = y_before``; ``0 ≤ alpha ≤ 1``.

    The same as ``lfilter([gain], [1, -alpha], x, zi=[alpha * y_before])[0]``; a low-pass
    with unit gain at DC that starts settled at ``x[0]`` is ``(x, alpha, 1 - alpha, x[0])``.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be within [0, 1], not {alpha}")
    y = np.multiply(np.asarray(x, dtype=np.float64), gain)
    if y.size:
        y[0] += alpha * y_before
        _accumulate(y, alpha)
    return y


def _accumulate(y: FloatArray, alpha: float) -> None:
    """In place: ``y[n] += alpha·y[n−1]`` in sequence (the recursion with a zero start)."""
    n = y.size
    log_alpha = math.log(alpha) if alpha > 0 else -math.inf
    block = MAX_BLOCK if log_alpha == 0 else int(min(MAX_BLOCK, LOG_RANGE / -log_alpha))
    if block < MIN_BLOCK or n <= 1:
        _doubling_scan(y, alpha)
        return
    block = min(block, n)
    rows = n // block
    grid = y[:rows * block].reshape(rows, block)  # views of y (contiguous): no copies
    tail = y[rows * block:].reshape(1, -1)
    k = np.arange(block, dtype=np.float64)
    if rows > 1 or tail.size:  # each block's end with a zero start, carried through the blocks
        ends = grid @ np.exp(log_alpha * k[::-1])
        _accumulate(ends, math.exp(log_alpha * block))
        grid[1:, 0] += alpha * ends[:-1]
        if tail.size:
            tail[0, 0] += alpha * ends[-1]
    for part in (grid, tail):
        j = k[:part.shape[1]]
        np.multiply(part, np.exp(-log_alpha * j), out=part)
        np.cumsum(part, axis=1, out=part)
        np.multiply(part, np.exp(log_alpha * j), out=part)


def _doubling_scan(y: FloatArray, alpha: float) -> None:
    """In place, the recursion for a filter that forgets fast, in passes of doubling shift.

    After the pass with shift s, ``y[n]`` holds ``Σ_{j<2s} alpha^j · x[n−j]``; the passes
    end once ``alpha^s`` underflows to 0 or s spans the array.
    """
    shift, power = 1, alpha
    while power > 0 and shift < y.size:
        y[shift:] += power * y[:-shift]
        shift, power = 2 * shift, power * power
