"""Each channel's lowest and highest finite value over time windows, gathered chunk by chunk.

Why a module of its own: an energy interval over a gap needs the extremes of the power
around it, and they are found in the same single pass that integrates a stream
(``alignment.StreamIntegral``); where the windows' rows lie in a chunk and how the
extremes fold in is a job apart from the integral.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
WindowRows = tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.bool_]]


class WindowExtremes:
    """Lowest and highest finite value of ``channels`` channels over each window.

    ``windows``: (start, end) pairs in the times' units; a window holds the rows
    start <= t < end. ``low``/``high`` are channels × windows, ±inf where a window holds
    no finite value.
    """

    def __init__(self, windows: npt.ArrayLike, channels: int) -> None:
        self.windows = np.asarray(windows).reshape(-1, 2)
        self.low = np.full((channels, len(self.windows)), np.inf)
        self.high = np.full((channels, len(self.windows)), -np.inf)

    def rows(self, t: npt.NDArray[Any]) -> WindowRows | None:
        """Where the windows' rows lie in a chunk, for ``fold``; None: in none.

        The chunk is cut at every window edge into blocks (``cuts``, from row 0); each
        window is then the blocks ``pairs[2w]:pairs[2w + 1]`` (a block past the last is the
        end), ``empty`` where it has no row here.
        """
        rows = np.searchsorted(t, self.windows.ravel(), side="left")
        empty = rows[0::2] >= rows[1::2]
        if empty.all():
            return None
        inner = rows[(rows > 0) & (rows < t.size)]
        if not inner.size:  # no edge inside: every window holds all of the chunk or none
            return np.zeros(1, dtype=np.intp), (rows > 0).astype(np.intp), empty
        cuts = np.unique(np.concatenate(([0], inner)))
        return cuts, np.searchsorted(cuts, rows), empty

    def fold(self, v: FloatArray, rows_in: WindowRows, finite: npt.NDArray[np.bool_]) -> None:
        """Fold a chunk's lowest and highest finite value per channel and window in.

        ``v``: channels × rows; ``finite``: the channels with no non-finite value here.
        """
        cuts, pairs, empty = rows_in
        x = v if finite.all() else np.where(np.isfinite(v), v, np.nan)
        folds = ((np.fmin, np.inf, self.low), (np.fmax, -np.inf, self.high))
        if cuts.size == 1:  # each window holds all of the chunk or none of it (most chunks)
            held = ~empty
            for fold, edge, out in folds:
                got = fold.reduce(x, axis=1)  # NaN: no finite value
                got[np.isnan(got)] = edge
                out[:, held] = fold(out[:, held], got[:, None])
            return
        for fold, edge, out in folds:
            blocks = fold.reduceat(x, cuts, axis=1)
            blocks = np.concatenate((blocks, np.full((len(v), 1), edge)), axis=1)  # the end
            got = fold.reduceat(blocks, pairs, axis=1)[:, 0::2]  # NaN: no finite value
            got[:, empty] = edge
            got[np.isnan(got)] = edge
            fold(out, got, out=out)
