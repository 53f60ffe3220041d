"""Rows that cannot be right, flagged as they are written (never dropped, never changed).

Why at ingest: times that go backwards, times far outside this host's clock (±2**62 fits
the file's columns) and NaN/inf readings were written without a word, and the first to
notice was an analysis that refused the whole file. The recorder sees every row once; it
marks each such row with a flag bit (docs/run-file.md) and counts them per stream in its
status, so a reader can tell a bad row from a good one and the operator hears of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.samples import SampleFlag

# a host time this far past the recorder's own clock cannot be a sample's (monotonic ns)
MAX_AHEAD_NS = 3600 * 10**9
TIME_BACKWARDS = "time_backwards"
TIME_OUT_OF_RANGE = "time_out_of_range"
NOT_FINITE = "not_finite"


def flag_suspect_rows(t_ns: npt.NDArray[np.int64], values: npt.NDArray[Any],
                      flags: npt.NDArray[np.uint8] | None, *, last_t_ns: int, now_ns: int,
                      counts: dict[str, int]) -> npt.NDArray[np.uint8]:
    """The batch's flags with ``TIME_INVALID`` and ``NOT_FINITE`` set where they apply.

    ``last_t_ns`` is the time of the stream's previous row (-1: none); ``counts`` (per
    kind) is updated.
    A NaN in a row its source already flagged ``NO_DATA`` is what that flag says: not
    counted again. ``flags`` is never written to (it may be a view on a received frame).
    """
    n = len(t_ns)
    previous = np.empty(n, dtype=np.int64)
    previous[:1] = last_t_ns
    previous[1:] = t_ns[:-1]
    out_of_range = _out_of_range(t_ns, now_ns)
    # a row out of range counts as that only; after one (or none: -1) the next row is
    # judged by its own time
    backwards = (t_ns < previous) & ~_out_of_range(previous, now_ns) & ~out_of_range
    given = flags if flags is not None else np.zeros(n, dtype=np.uint8)
    bad_values = ~np.isfinite(values).all(axis=1) & ((given & SampleFlag.NO_DATA) == 0)
    if not (backwards.any() or out_of_range.any() or bad_values.any()):
        return given
    for kind, rows in ((TIME_BACKWARDS, backwards), (TIME_OUT_OF_RANGE, out_of_range),
                       (NOT_FINITE, bad_values)):
        found = int(rows.sum())
        if found:
            counts[kind] = counts.get(kind, 0) + found
    marked = given.copy()
    marked[backwards | out_of_range] |= np.uint8(SampleFlag.TIME_INVALID)
    marked[bad_values] |= np.uint8(SampleFlag.NOT_FINITE)
    return marked


def _out_of_range(t_ns: npt.NDArray[np.int64], now_ns: int) -> npt.NDArray[np.bool_]:
    return (t_ns < 0) | (t_ns > now_ns + MAX_AHEAD_NS)
