"""Put streams of different rates on one time grid and measure how late one is behind another.

Why: calibration and comparisons need two streams side by side, but meters sample at kHz and
NVML at ~10-50 Hz with holes. Everything here works on *cumulative integrals*: a stream's
integral evaluated at arbitrary times gives exact bin means on any grid, streams in chunks
(so hour-long 20 kHz files never load whole), and marks uncovered time explicitly, so a gap
becomes NaN on the grid instead of being bridged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis.known_gaps import KnownGaps
from wattlab.analysis.window_extremes import WindowExtremes
from wattlab.errors import RunFileError, UsageError
from wattlab.runfile import Run, SourceView

FloatArray = npt.NDArray[np.float64]
GAP_FACTOR = 5.0
"""Two samples further apart than this many median spacings enclose a gap."""
PREFERRED_POWER_CHANNELS = ("power_total_w", "power_w")
SLICE_BYTES = 1 << 22
"""Bytes of rows read and integrated at a time (with their times): a slice stays in cache
from the read through every channel's block sums (an hour at 20 kHz in 1 M-row slices took
~1.5x as long as in 256 k; a 13-channel 20 kHz stream ran ~1.4x faster in 64-128 k rows,
4-7 MB, than in 256 k, 14 MB)."""


MATMUL_BLOCKS = 16
"""Blocks of a slice up to which its weighted sums are matrix-vector products."""
READ_AHEAD = True
"""Read a stream's next slice in a thread while this one is integrated; off in the workers
of ``many_runs`` that occupy every core (the thread then only adds its switching cost)."""


def slice_rows(view: SourceView) -> int:
    """Rows of a source that make about ``SLICE_BYTES``."""
    return max(1 << 12, SLICE_BYTES // (view.row_bytes + 8))


def power_channel(view: SourceView) -> str | None:
    """The channel that is the source's power draw.

    A source names it in ``config["power_channel"]`` (null: it measures no power, e.g. a
    stream whose only watts are a power *limit*); otherwise a preferred name, else the
    first channel in W.
    """
    config = view.descriptor.get("config", {})
    if "power_channel" in config:
        chosen = config["power_channel"]
        return chosen if chosen in view.channel_names else None
    for name in PREFERRED_POWER_CHANNELS:
        if name in view.channel_names and view.unit(name) == "W":
            return name
    for name, unit in zip(view.channel_names, view.units, strict=True):
        if unit == "W":
            return name
    return None


def json_safe(obj: Any) -> Any:
    """Numpy scalars to Python, NaN/inf to None: records must be strict JSON."""
    kind = type(obj)
    if kind is float:  # most of a report, then the types kept as they are: checked first
        return obj if math.isfinite(obj) else None
    if kind is str or kind is int or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``SRC[:CHANNEL]`` into (source id, channel or None)."""
    source, _, channel = spec.partition(":")
    if not source:
        raise UsageError(f"stream {spec!r}: expected SRC[:CHANNEL]")
    return source, channel or None


def resolve(run: Run, spec: str) -> tuple[SourceView, str]:
    """The source view and channel a ``SRC[:CHANNEL]`` names (default: its power channel)."""
    source_id, channel = parse_spec(spec)
    view = run.source(source_id)
    if channel is None:
        channel = power_channel(view)
        if channel is None:
            raise UsageError(
                f"{run.path}: source {source_id!r} has no power channel; name one of "
                f"{view.channel_names} as {source_id}:CHANNEL"
            )
    view.channel_index(channel)
    return view, channel


def median_spacing_s(view: SourceView) -> float:
    """Median sample spacing from the first rows (cheap on huge files)."""
    def compute() -> float:
        diffs = np.diff(view.head_ns())
        return float(np.median(diffs)) / 1e9 if diffs.size else 0.0

    return view.memo("median_spacing_s", compute)


def known_gaps_ns(run: Run, source_id: str) -> list[tuple[int, int]]:
    """Gaps the recorder wrote for a source, as (first, last) session ns, where known."""
    return [(g.time_first_ns, g.time_last_ns) for g in run.gaps
            if g.source == source_id and g.time_first_ns is not None
            and g.time_last_ns is not None]


@dataclass
class Cumulative:
    """A stream's running integral and uncovered time, evaluated at query times.

    ``integral`` is ∫value dt (J for a power stream) from the first sample; ``uncovered_s``
    counts time inside the data span that falls in gaps (not integrated); ``span_s`` is the
    (first, last) sample time. Queries outside the span are clipped to it: callers add the
    outside part as uncovered. ``bridge`` is what the gaps would add if each were bridged
    by a straight line between its edge samples (a best estimate, never part of
    ``integral``), and ``unbridged_s`` the gap time where an edge value is not finite.
    """

    times_s: FloatArray
    integral: FloatArray
    uncovered_s: FloatArray
    span_s: tuple[float, float]
    n_gaps: int = 0
    gaps_s: list[tuple[float, float]] = field(default_factory=list)
    bridge: FloatArray = field(default_factory=lambda: np.zeros(0))
    unbridged_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    window_min: FloatArray = field(default_factory=lambda: np.zeros(0))
    window_max: FloatArray = field(default_factory=lambda: np.zeros(0))


def chunks_s(
    view: SourceView, channel: str, rows: int = 1 << 20
) -> Iterator[tuple[FloatArray, FloatArray]]:
    """(session seconds, float values) chunks of one channel."""
    for t_ns, values in view.iter_chunks(channel, rows):
        yield t_ns.astype(np.float64) / 1e9, np.asarray(values, dtype=np.float64)


@dataclass
class _Holes:
    """The hole segments of a chunk, and where its queries fall on them.

    ``bad`` masks the segments, ``idx`` lists them. Per query (``x``: its time from the
    chunk's first sample): ``j`` is the segment ``np.interp`` would place it on in
    ``_slow``, ``rel_j``/``rel_j1`` that segment's ends, ``before`` the holes ahead of it,
    and ``inside`` whether it falls strictly inside a hole.
    """

    bad: npt.NDArray[np.bool_]
    idx: npt.NDArray[np.intp]
    x: FloatArray
    j: npt.NDArray[np.intp]
    rel_j: FloatArray
    rel_j1: FloatArray
    before: npt.NDArray[np.intp]
    inside: npt.NDArray[np.bool_]


class TimeGoesBackwards(RunFileError):
    """A stream's rows are not in time order: its integral does not exist."""


class StreamIntegral:
    """Running integrals of some channels of one stream at sorted query times, fed in chunks.

    Why: an hour of 20 kHz data must be read once for all its channels and never whole.
    Between two samples the stream is a trapezoid (``hold=False``) or the earlier value held
    (``hold=True``, right for readings that only change at driver updates). A segment longer
    than ``gap_limit``, with a non-finite end, or overlapping a ``known_gaps`` interval
    (known_gaps.py) is a gap: not integrated, counted as uncovered. Times (and
    ``gap_limit``, ``known_gaps``) are in units of 1 / ``per_s`` seconds: with int64 ns
    (``per_s=1e9``) segment lengths are exact. Chunks take a fast path (block sums, no
    per-sample cumulative): a hole weighs nothing in the sums and only its own segments
    are looked at again; a channel with a non-finite value in the chunk goes segment by
    segment (``_slow``).
    ``bridges=False`` leaves ``bridge``/``unbridged_s`` out (half the memory per query).
    ``windows``: (start, end) pairs in the times' units; each column's lowest and highest
    finite value over the rows start <= t < end of each (``window_min``/``window_max``,
    ±inf where none), found in the same pass (an energy interval over a gap needs them;
    window_extremes.py).
    """

    def __init__(self, query_s: npt.ArrayLike, columns: Sequence[int], gap_limit: float, *,
                 known_gaps: Sequence[tuple[float, float]] = (), hold: bool = False,
                 per_s: float = 1.0, bridges: bool = True,
                 windows: npt.ArrayLike = ()) -> None:
        self.query_s = np.asarray(query_s, dtype=np.float64)
        if np.any(self.query_s[1:] < self.query_s[:-1]):  # no temporary of millions of floats
            raise UsageError("cumulative_at needs sorted query times")
        self._q = self.query_s * per_s
        self.columns = list(columns)
        self.gap_limit = gap_limit
        self.hold = hold
        self.per_s = per_s
        self._known = KnownGaps(known_gaps)
        # integral, uncovered s, bridge, unbridged s: per channel, at each query (each one
        # contiguous: the callers' arrays are millions of queries)
        self._out = np.full((4 if bridges else 2, len(self.columns), self.query_s.size), np.nan)
        self._acc = np.zeros(self._out.shape[:2])
        self._dt: npt.NDArray[Any] = np.empty(0)
        self._dt_s: FloatArray = np.empty(0)
        self._w: FloatArray = np.empty(0)
        self._v: FloatArray = np.empty((0, 0))  # channels × rows
        self._wv: FloatArray = np.empty((0, 0))
        self._gaps: list[list[tuple[float, float]]] = [[] for _ in self.columns]
        self._extremes = WindowExtremes(windows, len(self.columns))
        self._prev: tuple[Any, npt.NDArray[Any]] | None = None
        self._first: Any = None
        self._last: Any = None

    def feed(self, t: npt.NDArray[Any], values: npt.NDArray[Any], *,
             continues: bool = False) -> None:
        """Add the next rows: times (n,) and values (n × all channels) in time order.

        ``continues``: the first row is the last row fed before (``iter_rows(overlap=True)``),
        so no separate segment joins the two (a whole pass of small steps saved per slice).
        """
        if t.size == 0:
            return
        if self._prev is None:
            self._first = t[0]
        elif continues:
            if t[0] != self._prev[0]:
                raise UsageError("feed(continues=True): the first row is not the last one fed")
        else:  # the segment joining the previous chunk to this one
            self._block(np.array([self._prev[0], t[0]], dtype=t.dtype),
                        np.stack([self._prev[1], values[0]]))
        if t.size > 1:
            self._block(t, values)
        self._prev = (t[-1], np.array(values[-1]))
        self._last = t[-1]

    def _block(self, t: npt.NDArray[Any], values: npt.NDArray[Any]) -> None:
        """Integrate rows with no sample before them left to join (n ≥ 2)."""
        if self._dt.size < t.size - 1 or self._dt.dtype != t.dtype:
            # reused between slices, as is ``_v``: a fresh array per slice costs page faults
            self._dt = np.empty(t.size - 1, dtype=t.dtype)
            self._dt_s, self._w = np.empty(t.size - 1), np.empty(t.size)
            self._v, self._wv = (np.empty((len(self.columns), t.size)) for _ in range(2))
        dt = np.subtract(t[1:], t[:-1], out=self._dt[:t.size - 1])
        dt_min, dt_max = dt.min(), dt.max()
        if dt_min < 0:
            i = int(np.argmax(dt < 0))
            raise TimeGoesBackwards(f"time goes backwards, from {t[i] / self.per_s:.9g} s to "
                                    f"{t[i + 1] / self.per_s:.9g} s; cannot integrate it")
        a = int(np.searchsorted(self._q, t[0], side="left"))
        b = int(np.searchsorted(self._q, t[-1], side="right"))
        holes = self._holes(t, dt, rows=(a, b)) if dt_max > self.gap_limit \
            or self._known.open_within(t[0], t[-1]) else None
        uniform = holes is None and dt_min == dt_max
        key = self._q[a:b]
        integer = t.dtype.kind in "iu"
        if integer:  # t_k <= q  <=>  t_k <= floor(q) for integer times
            key = np.floor(key).astype(np.int64)
        if integer and uniform and dt_min > 0:  # the sample at or before each query
            k = np.clip((key - t[0]) // dt_min, 0, t.size - 2)
            t_k = t[0] + k * dt_min
        else:
            k = np.clip(np.searchsorted(t, key, side="right") - 1, 0, t.size - 2)
            t_k = t[k]
        new = np.ones(k.size, dtype=bool)
        new[1:] = k[1:] != k[:-1]
        ends = np.concatenate((k[new], [t.size - 1]))  # k is sorted and at most n − 2
        starts = np.concatenate(([0], ends[:-1] + 1))
        at_k = np.cumsum(new) - 1  # where each query's sample is among the ends
        frac_s = (self._q[a:b] - t_k) / self.per_s
        step_s = float(dt_min) / self.per_s
        weights = None
        if not uniform:
            dt_s = np.divide(dt, self.per_s, out=self._dt_s[:dt.size])
            if holes is not None:  # holes weigh nothing: the sums add covered segments only
                dt_s[holes.idx] = 0.0
            weights = self._weights(dt_s)
        rows_in = self._extremes.rows(t) if self._extremes.windows.size else None
        # every channel at once: one row each, so that each step is one call for all
        v = self._channels(values)
        sums = np.cumsum(self._block_sums(v, weights, starts), axis=1)
        if weights is not None and not self.hold:
            sums *= 0.5  # the trapezoids' halves (exact: a power of two)
        finite = np.isfinite(sums[:, -1])
        if rows_in is not None:
            self._extremes.fold(v, rows_in, finite)
        v_end = v[:, ends]
        if weights is not None:  # prefix sums of weights·v up to each end, less its own
            held = np.append(dt_s[ends[:-1]], 0)  # the last end is n − 1
            at_end = sums - (held if self.hold else 0.5 * held) * v_end
        elif self.hold:
            at_end = step_s * (sums - v_end)
        else:
            at_end = step_s * (sums - 0.5 * v[:, :1] - 0.5 * v_end)
        step = v[:, k] if self.hold else 0.5 * (v[:, k] + v[:, k + 1])
        if holes is not None:
            step[:, holes.bad[k]] = 0.0  # a query inside a hole: nothing integrated there
        self._out[0, :, a:b] = self._acc[0, :, None] + at_end[:, at_k] + step * frac_s
        self._acc[0, finite] += at_end[finite, -1]
        if holes is None:
            self._out[1:, :, a:b] = self._acc[1:, :, None]
        else:
            self._hole_parts(t, v, holes, finite, rows=(a, b))
        for c in np.flatnonzero(~finite):  # a non-finite value: segment by segment
            self._slow(int(c), t, dt, v[c], rows=(a, b))

    def _holes(self, t: npt.NDArray[Any], dt: npt.NDArray[Any], *,
               rows: tuple[int, int]) -> _Holes:
        """The segments of a chunk that are holes: too long, or inside a recorded gap."""
        bad = dt > self.gap_limit
        self._known.mark(t, bad)
        idx = np.flatnonzero(bad)
        x = self._q[rows[0]:rows[1]] - t[0]
        if t.dtype.kind in "iu":  # exact offsets: rel <= x  <=>  t <= t[0] + floor(x)
            j = np.searchsorted(t, t[0] + np.floor(x).astype(t.dtype), side="right") - 1
            rel_j = (t[j] - t[0]).astype(np.float64)
            rel_j1 = (t[np.minimum(j + 1, t.size - 1)] - t[0]).astype(np.float64)
        else:
            rel = (t - t[0]).astype(np.float64)
            j = np.searchsorted(rel, x, side="right") - 1
            rel_j, rel_j1 = rel[j], rel[np.minimum(j + 1, t.size - 1)]
        inside = (j < t.size - 1) & bad[np.minimum(j, t.size - 2)] & (x != rel_j)
        return _Holes(bad, idx, x, j, rel_j, rel_j1, np.searchsorted(idx, j, side="left"),
                      inside)

    def _hole_parts(self, t: npt.NDArray[Any], v: FloatArray, holes: _Holes,
                    finite: npt.NDArray[np.bool_], *, rows: tuple[int, int]) -> None:
        """Uncovered time and bridge of a chunk's holes (finite channels), as ``_slow`` has them.

        Only the holes' own segments are touched: the running sums step at them alone, and
        each query is placed on them as ``np.interp`` places it in ``_slow``.
        """
        a, b = rows
        i, inside = holes.idx, holes.inside
        dt_s = self._dt[i] / self.per_s
        line = 0.5 * (v[:, i + 1] + v[:, i]) * dt_s
        spans = [(float(t[g] / self.per_s), float(t[g + 1] / self.per_s)) for g in i]
        for c in np.flatnonzero(finite):
            self._gaps[c] += spans
        n_parts = self._out.shape[0]
        for part, steps in ((1, np.broadcast_to(dt_s, line.shape)), (2, line))[:n_parts - 1]:
            # the running sum before each hole, then at the end
            run = np.concatenate((np.zeros((len(v), 1)), np.cumsum(steps, axis=1)), axis=1)
            acc = self._acc[part, :, None]
            at = acc + run[:, holes.before]
            if inside.any():
                r0, r1 = holes.rel_j[inside], holes.rel_j1[inside]
                y0, y1 = at[:, inside], acc + run[:, holes.before[inside] + 1]
                at[:, inside] = (y1 - y0) / (r1 - r0) * (holes.x[inside] - r0) + y0
            self._out[part, finite, a:b] = at[finite]
            self._acc[part, finite] += run[finite, -1]
        if n_parts == 4:
            self._out[3, finite, a:b] = self._acc[3, finite, None]

    def _channels(self, values: npt.NDArray[Any]) -> FloatArray:
        """The channels of the rows as float64, one contiguous row each, in reused buffers.

        Why: a channel of a rows × channels slice is strided; one pass makes it a plain
        array that the block sums and lookups then read at a fraction of the cost (the
        float32 values convert exactly, so the sums are the same).
        """
        out = self._v[:, :values.shape[0]]
        for c, col in enumerate(self.columns):
            np.copyto(out[c], values[:, col])
        return out

    def _weights(self, dt_s: FloatArray) -> FloatArray:
        """Per-sample weights whose prefix sums give the integral up to a sample (and past it).

        Trapezoids: the segments before and after each sample, *twice* the weight (the sums
        are halved once, not every weight: one pass less per slice).
        """
        w = self._w[:dt_s.size + 1]
        if self.hold:
            w[:-1] = dt_s
            w[-1] = 0.0
        else:
            w[0], w[-1] = dt_s[0], dt_s[-1]
            np.add(dt_s[1:], dt_s[:-1], out=w[1:-1])
        return w

    def _block_sums(self, v: FloatArray, weights: FloatArray | None,
                    starts: npt.NDArray[np.intp]) -> FloatArray:
        """Per channel, the sums of (weights·)values over the blocks from each of ``starts``.

        A few blocks (a report's phase edges): one matrix-vector product per block, with
        no weighted copy of the rows; many (a resampling grid): weighted rows, then sums.
        """
        if weights is None:
            return np.asarray(np.add.reduceat(v, starts, axis=1), dtype=np.float64)
        if starts.size <= MATMUL_BLOCKS:
            bounds = np.append(starts, v.shape[1])
            return np.stack([v[:, a:b] @ weights[a:b]
                             for a, b in pairwise(bounds.tolist())], axis=1)
        wv = np.multiply(v, weights, out=self._wv[:, :v.shape[1]])
        return np.asarray(np.add.reduceat(wv, starts, axis=1), dtype=np.float64)

    def _slow(self, c: int, t: npt.NDArray[Any], dt: npt.NDArray[Any], v_in: npt.NDArray[Any],
              *, rows: tuple[int, int]) -> None:
        """Segment by segment, for chunks with gaps or non-finite values (queries a:b)."""
        a, b = rows
        v = np.asarray(v_in, dtype=np.float64)
        dt_s = dt / self.per_s
        line = 0.5 * (v[1:] + v[:-1]) * dt_s
        seg = v[:-1] * dt_s if self.hold else line
        bad = (dt > self.gap_limit) | ~np.isfinite(seg)
        if self._known.count:
            bad |= self._known.open_over(t)
        fin = np.isfinite(line)
        parts = (np.where(bad, 0.0, seg), np.where(bad, dt_s, 0.0),
                 np.where(bad & fin, line, 0.0), np.where(bad & ~fin, dt_s, 0.0))
        for i in np.flatnonzero(bad):
            self._gaps[c].append((float(t[i] / self.per_s), float(t[i + 1] / self.per_s)))
        rel = (t - t[0]).astype(np.float64)
        for j, x in enumerate(parts[:self._out.shape[0]]):
            cum = self._acc[j, c] + np.concatenate(([0.0], np.cumsum(x)))
            if b > a:
                self._out[j, c, a:b] = np.interp(self._q[a:b] - t[0], rel, cum)
            self._acc[j, c] = float(cum[-1])

    def result(self) -> list[Cumulative]:
        """One ``Cumulative`` per column, in the order of ``columns``."""
        if self._prev is None:
            span = (math.nan, math.nan)
        else:
            self._out[:, :, self._q < self._first] = 0.0
            self._out[:, :, self._q > self._last] = self._acc[:, :, None]
            span = (float(self._first / self.per_s), float(self._last / self.per_s))
        out = [Cumulative(self.query_s, self._out[0, c], self._out[1, c], span,
                          len(self._gaps[c]), self._gaps[c], window_min=self._extremes.low[c],
                          window_max=self._extremes.high[c]) for c in range(len(self.columns))]
        if self._out.shape[0] == 4:
            for c, cum in enumerate(out):
                cum.bridge, cum.unbridged_s = self._out[2, c], self._out[3, c]
        return out


def cumulative_at(
    chunks: Iterable[tuple[FloatArray, FloatArray]],
    query_s: npt.ArrayLike,
    gap_limit_s: float,
    known_gaps: list[tuple[float, float]] | None = None,
    hold: bool = False,
) -> Cumulative:
    """Running integral of one stream (chunks of seconds, values) at sorted query times.

    The rules are ``StreamIntegral``'s; ``known_gaps`` are (first, last) seconds.
    """
    acc = StreamIntegral(query_s, [0], gap_limit_s, known_gaps=known_gaps or (), hold=hold)
    for t, v in chunks:
        acc.feed(np.asarray(t), np.asarray(v).reshape(-1, 1))
    return acc.result()[0]


def gap_limit_ns(view: SourceView, gap_factor: float = GAP_FACTOR) -> float:
    """Longest segment of a stream that is not a hole: ``gap_factor`` median spacings."""
    limit = gap_factor * median_spacing_s(view) * 1e9
    return limit if limit > 0 else math.inf


def integrate_view(
    view: SourceView,
    channels: Sequence[str],
    query_s: npt.ArrayLike,
    *,
    known_gaps_ns: Sequence[tuple[int, int]] = (),
    hold: bool = False,
    gap_factor: float = GAP_FACTOR,
    gap_limit_s: float | None = None,
    bridges: bool = True,
    windows_s: Sequence[tuple[float, float]] = (),
) -> list[Cumulative]:
    """Cumulative integrals of several channels of a source at sorted times, in one pass.

    A segment is a hole beyond ``gap_limit_s`` (default: ``gap_factor`` median spacings).
    ``windows_s``: (start, end) seconds whose lowest and highest values to find on the way.
    """
    limit_ns = gap_limit_ns(view, gap_factor) if gap_limit_s is None else gap_limit_s * 1e9
    # integer t >= x  <=>  t >= ceil(x)
    windows_ns = np.ceil(np.array(windows_s, dtype=np.float64).reshape(-1, 2) * 1e9
                         ).astype(np.int64)
    acc = StreamIntegral(query_s, [view.channel_index(ch) for ch in channels], limit_ns,
                         known_gaps=known_gaps_ns, hold=hold, per_s=1e9, bridges=bridges,
                         windows=windows_ns)
    rows = slice_rows(view)
    try:
        for k, (t_ns, values) in enumerate(view.iter_rows(
                rows, prefetch=READ_AHEAD and len(view) > rows, overlap=True)):
            acc.feed(t_ns, values, continues=k > 0)
    except TimeGoesBackwards as e:  # the integral knows neither the file nor the stream
        raise TimeGoesBackwards(f"{view.path}: stream {view.source_id}: {e}") from e
    return acc.result()


def bin_means(cum: Cumulative, tolerance: float = 1e-9) -> FloatArray:
    """Means over the bins between consecutive query times; NaN where a bin is not covered."""
    t = cum.times_s
    dt = np.diff(t)
    a, b = cum.span_s  # the bins inside the span are a contiguous run (times are sorted)
    i0 = int(np.searchsorted(t[:-1], a - tolerance, side="left"))
    i1 = max(i0, int(np.searchsorted(t[1:], b + tolerance, side="right")))
    ok = np.zeros(dt.shape, dtype=bool)
    inner = dt[i0:i1]
    if cum.uncovered_s[i1] == cum.uncovered_s[i0]:  # it never decreases: no gap in there
        ok[i0:i1] = inner > 0
    else:
        ok[i0:i1] = (np.diff(cum.uncovered_s[i0:i1 + 1]) <= tolerance * np.maximum(inner, 1.0)) \
            & (inner > 0)
    # in place: on a grid of millions of bins each fresh array costs its page faults
    means = np.diff(cum.integral)
    np.divide(means, dt, out=means, where=ok)
    means[~ok] = np.nan
    return means


def grid_edges(t0_s: float, t1_s: float, rate_hz: float) -> FloatArray:
    """Edges of bins of 1/rate s covering [t0, t1] (the last partial bin dropped)."""
    if rate_hz <= 0 or t1_s <= t0_s:
        raise UsageError(f"empty grid: {t0_s:.3f}..{t1_s:.3f} s at {rate_hz} Hz")
    n = int(np.floor((t1_s - t0_s) * rate_hz + 1e-9))
    edges = np.arange(n + 1, dtype=np.float64)  # in place: grids can be millions of edges
    edges /= rate_hz
    edges += t0_s
    return edges


def span_s(view: SourceView) -> tuple[float, float]:
    """(first, last) sample time of a source in session seconds."""
    n = len(view)
    if n == 0:
        raise RunFileError(f"source {view.source_id!r} has no samples")
    first, last = view.first_last_ns()
    return first / 1e9, last / 1e9


def resample_view(
    run: Run,
    view: SourceView,
    channel: str,
    edges_s: FloatArray,
    *,
    hold: bool = False,
    gap_factor: float = GAP_FACTOR,
) -> FloatArray:
    """Bin means of one channel on a grid (edges), NaN where a bin touches a gap."""
    cum = integrate_view(view, [channel], edges_s, hold=hold, gap_factor=gap_factor,
                         known_gaps_ns=known_gaps_ns(run, view.source_id), bridges=False)[0]
    return bin_means(cum)


def resample_points(
    t_s: FloatArray, values: FloatArray, grid_s: FloatArray, max_age_s: float
) -> FloatArray:
    """The value last read at each grid time (sample-and-hold), NaN if older than max_age."""
    idx = np.searchsorted(t_s, grid_s, side="right") - 1
    out = np.full(grid_s.shape, np.nan)
    ok = idx >= 0
    out[ok] = values[idx[ok]]
    age = np.where(ok, grid_s - t_s[np.maximum(idx, 0)], np.inf)
    out[age > max_age_s] = np.nan
    return out


@dataclass
class Aligned:
    """Several streams as bin means on one grid: ``t_s`` are bin centres."""

    t_s: FloatArray
    rate_hz: float
    values: dict[str, FloatArray]
    units: dict[str, str]

    def to_pandas(self) -> Any:
        from wattlab.frames_import import frames_module

        pd = frames_module("pandas", "Aligned.to_pandas()")
        return pd.DataFrame(self.values, index=pd.Index(self.t_s, name="time_s"))


def aligned(
    run: Run,
    rate_hz: float,
    *specs: str,
    t0_s: float | None = None,
    t1_s: float | None = None,
    hold: bool = False,
) -> Aligned:
    """Streams ``SRC[:CHANNEL]`` resampled to bin means at ``rate_hz`` over their common span.

    Bins that touch a gap of a stream are NaN in that stream (gaps are kept, never bridged).
    """
    if not specs:
        raise UsageError("aligned() needs at least one stream")
    resolved = [resolve(run, s) for s in specs]
    spans = [span_s(v) for v, _ in resolved]
    a = max(s[0] for s in spans) if t0_s is None else t0_s
    b = min(s[1] for s in spans) if t1_s is None else t1_s
    edges = grid_edges(a, b, rate_hz)
    values = {
        spec: resample_view(run, view, ch, edges, hold=hold)
        for spec, (view, ch) in zip(specs, resolved, strict=True)
    }
    units = {spec: view.unit(ch) for spec, (view, ch) in zip(specs, resolved, strict=True)}
    return Aligned(0.5 * (edges[1:] + edges[:-1]), rate_hz, values, units)


@dataclass(frozen=True)
class LagEstimate:
    """How late ``target`` is behind ``reference``: target(t) ≈ reference(t − lag_s).

    ``correlation`` is the normalised cross-correlation at the peak (−1..1); ``confidence``
    (0..1) is how much the peak stands out from the best correlation more than a
    ``resolution`` away from it; ``uncertainty_s`` is a standard error from block estimates.
    """

    lag_s: float
    correlation: float
    confidence: float
    uncertainty_s: float


def _xcorr(ref: FloatArray, target: FloatArray, max_lag: int) -> FloatArray:
    """Normalised cross-correlation for lags −max..max (NaN-aware, by FFT).

    The energies that normalise it are correlations with the other stream's mask; where
    that stream has no hole they are sums over the overlap, from a running sum (a third of
    the FFTs: this is most of the lag search on an hour-long recording).
    """
    ok_r, ok_t = np.isfinite(ref), np.isfinite(target)
    r = np.where(ok_r, ref - np.nanmean(ref), 0.0)
    x = np.where(ok_t, target - np.nanmean(target), 0.0)
    n = r.size
    size = 1 << int(np.ceil(np.log2(n + max_lag)))  # enough padding that no lag wraps around
    lags = np.arange(-max_lag, max_lag + 1)

    def corr(a: FloatArray, b: FloatArray) -> FloatArray:
        full = np.fft.irfft(np.conj(np.fft.rfft(a, size)) * np.fft.rfft(b, size), size)
        return np.concatenate((full[size - max_lag:], full[: max_lag + 1]))

    def overlap_sum(sq: FloatArray, shift: npt.NDArray[np.int64]) -> FloatArray:
        """Σ sq[i] over the i that overlap the other stream, sq's index range moved by shift."""
        cum = np.concatenate(([0.0], np.cumsum(sq)))
        return np.asarray(cum[np.minimum(n, n + shift)] - cum[np.maximum(0, shift)],
                          dtype=np.float64)

    num = corr(r, x)
    # Σ r[i]² where target[i + lag] exists; Σ x[j]² where ref[j − lag] exists
    e_r = overlap_sum(r * r, -lags) if ok_t.all() else corr(r * r, ok_t.astype(np.float64))
    e_x = overlap_sum(x * x, lags) if ok_r.all() else corr(ok_r.astype(np.float64), x * x)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num / np.sqrt(e_r * e_x)
    return np.asarray(np.where(np.isfinite(out), out, -1.0), dtype=np.float64)


def _peak(c: FloatArray, max_lag: int) -> tuple[float, float]:
    """Sub-sample peak position (in samples, relative to lag 0) and height."""
    i = int(np.argmax(c))
    shift = 0.0
    if 0 < i < c.size - 1:
        y0, y1, y2 = c[i - 1], c[i], c[i + 1]
        den = y0 - 2 * y1 + y2
        if den < 0:
            shift = float(np.clip(0.5 * (y0 - y2) / den, -0.5, 0.5))
    return i - max_lag + shift, float(c[i])


def estimate_lag(
    reference: FloatArray,
    target: FloatArray,
    rate_hz: float,
    *,
    max_lag_s: float = 2.0,
    min_lag_s: float | None = None,
    blocks: int = 8,
) -> LagEstimate:
    """Lag of ``target`` behind ``reference`` (both on one grid) by cross-correlation.

    Positive: the target is late. The peak is refined to sub-sample precision; the
    uncertainty is the spread of the peak over ``blocks`` consecutive stretches.
    """
    if reference.shape != target.shape:
        raise UsageError("estimate_lag needs two streams on one grid")
    max_lag = max(1, round(max_lag_s * rate_hz))
    if reference.size < 4 * max_lag:
        raise UsageError(
            f"streams of {reference.size / rate_hz:.1f} s are too short for a lag search "
            f"of ±{max_lag_s:g} s"
        )
    c = _xcorr(reference, target, max_lag)
    if min_lag_s is not None:
        c[: max(0, round(min_lag_s * rate_hz) + max_lag)] = -1.0
    pos, height = _peak(c, max_lag)
    # confidence: peak height against the best value outside the main lobe
    half = np.flatnonzero(c >= 0.5 * height) if height > 0 else np.array([], dtype=np.int64)
    lobe = np.zeros(c.size, dtype=bool)
    centre = round(pos) + max_lag
    if half.size:
        lo = hi = centre
        while lo - 1 >= 0 and c[lo - 1] >= 0.5 * height:
            lo -= 1
        while hi + 1 < c.size and c[hi + 1] >= 0.5 * height:
            hi += 1
        lobe[lo:hi + 1] = True
    others = c[~lobe]
    second = float(others.max()) if others.size else 0.0
    confidence = float(np.clip(height, 0, 1) * np.clip(1 - max(second, 0) / height, 0, 1)) \
        if height > 0 else 0.0
    # block spread
    lags = []
    size = reference.size // blocks
    if blocks > 1 and size > 4 * max_lag:
        for k in range(blocks):
            sl = slice(k * size, (k + 1) * size)
            cb = _xcorr(reference[sl], target[sl], max_lag)
            window = np.full(cb.shape, -1.0)
            lo_i, hi_i = max(0, centre - max_lag // 4 - 2), min(cb.size, centre + max_lag // 4 + 3)
            window[lo_i:hi_i] = cb[lo_i:hi_i]
            p, h = _peak(window, max_lag)
            if h > 0:
                lags.append(p)
    se = float(np.std(lags, ddof=1) / np.sqrt(len(lags))) / rate_hz if len(lags) > 2 else np.nan
    return LagEstimate(pos / rate_hz, height, confidence, se)
