"""Put streams of different rates on one time grid and measure how late one is behind another.

Why: calibration and comparisons need two streams side by side, but meters sample at kHz and
NVML at ~10-50 Hz with holes. Everything here works on *cumulative integrals*: a stream's
integral evaluated at arbitrary times gives exact bin means on any grid, streams in chunks
(so hour-long 20 kHz files never load whole), and marks uncovered time explicitly, so a gap
becomes NaN on the grid instead of being bridged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis.run_file import Run, SourceView
from wattlab.errors import RunFileError, UsageError

FloatArray = npt.NDArray[np.float64]
GAP_FACTOR = 5.0
"""Two samples further apart than this many median spacings enclose a gap."""
PREFERRED_POWER_CHANNELS = ("power_total_w", "power_w")


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
    diffs = np.diff(view.time_slice(0, 10_000))
    return float(np.median(diffs)) / 1e9 if diffs.size else 0.0


def known_gaps_s(run: Run, source_id: str) -> list[tuple[float, float]]:
    """Gaps the recorder wrote for a source, as (first, last) session seconds, where known."""
    out = []
    for g in run.gaps:
        if g.source == source_id and g.time_first_ns is not None and g.time_last_ns is not None:
            out.append((g.time_first_ns / 1e9, g.time_last_ns / 1e9))
    return out


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


def chunks_s(
    view: SourceView, channel: str, rows: int = 1 << 20
) -> Iterator[tuple[FloatArray, FloatArray]]:
    """(session seconds, float values) chunks of one channel."""
    for t_ns, values in view.iter_chunks(channel, rows):
        yield t_ns.astype(np.float64) / 1e9, np.asarray(values, dtype=np.float64)


def cumulative_at(
    chunks: Iterable[tuple[FloatArray, FloatArray]],
    query_s: npt.ArrayLike,
    gap_limit_s: float,
    known_gaps: list[tuple[float, float]] | None = None,
    hold: bool = False,
) -> Cumulative:
    """Running integral of a stream at sorted query times, one chunk at a time.

    Between two samples the stream is a trapezoid (``hold=False``) or the earlier value held
    (``hold=True``, right for readings that only change at driver updates). A segment longer
    than ``gap_limit_s``, with a non-finite end, or overlapping a ``known_gaps`` interval is a
    gap: not integrated, counted as uncovered.
    """
    q = np.asarray(query_s, dtype=np.float64)
    if q.size and np.any(np.diff(q) < 0):
        raise UsageError("cumulative_at needs sorted query times")
    integral = np.full(q.shape, np.nan)
    uncovered = np.full(q.shape, np.nan)
    bridge = np.full(q.shape, np.nan)
    unbridged = np.full(q.shape, np.nan)
    gaps = sorted(known_gaps or [])
    gap_a = np.array([g[0] for g in gaps])
    gap_b = np.sort(np.array([g[1] for g in gaps]))
    acc_i = acc_u = acc_b = acc_n = 0.0
    prev: tuple[float, float] | None = None
    first = last = np.nan
    gap_list: list[tuple[float, float]] = []
    for t_chunk, v_chunk in chunks:
        if t_chunk.size == 0:
            continue
        if prev is None:
            first = float(t_chunk[0])
            t, v = t_chunk, v_chunk
        else:
            t = np.concatenate(([prev[0]], t_chunk))
            v = np.concatenate(([prev[1]], v_chunk))
        dt = np.diff(t)
        if np.any(dt < 0):
            raise RunFileError("stream time goes backwards; cannot integrate it")
        seg = v[:-1] * dt if hold else 0.5 * (v[1:] + v[:-1]) * dt
        bad = (dt > gap_limit_s) | ~np.isfinite(seg)
        if gaps:
            lo = np.searchsorted(gap_a, t[1:], side="left")  # gaps starting before seg end
            hi = np.searchsorted(gap_b, t[:-1], side="right")  # gaps ending before seg start
            bad |= lo > hi
        line = 0.5 * (v[1:] + v[:-1]) * dt
        fin = np.isfinite(line)
        brg = np.where(bad & fin, line, 0.0)
        nob = np.where(bad & ~fin, dt, 0.0)
        seg = np.where(bad, 0.0, seg)
        unc = np.where(bad, dt, 0.0)
        for i in np.flatnonzero(bad):
            gap_list.append((float(t[i]), float(t[i + 1])))
        cums = [acc + np.concatenate(([0.0], np.cumsum(x)))
                for acc, x in ((acc_i, seg), (acc_u, unc), (acc_b, brg), (acc_n, nob))]
        a = int(np.searchsorted(q, t[0], side="left"))
        b = int(np.searchsorted(q, t[-1], side="right"))
        if b > a:
            for out, cum in zip((integral, uncovered, bridge, unbridged), cums, strict=True):
                out[a:b] = np.interp(q[a:b], t, cum)
        acc_i, acc_u, acc_b, acc_n = (float(c[-1]) for c in cums)
        prev = (float(t[-1]), float(v[-1]))
        last = float(t[-1])
    if prev is None:
        return Cumulative(q, integral, uncovered, (np.nan, np.nan), 0, [], bridge, unbridged)
    for out, acc in ((integral, acc_i), (uncovered, acc_u), (bridge, acc_b),
                     (unbridged, acc_n)):
        out[q < first] = 0.0
        out[q > last] = acc
    return Cumulative(q, integral, uncovered, (first, last), len(gap_list), gap_list,
                      bridge, unbridged)


def bin_means(cum: Cumulative, tolerance: float = 1e-9) -> FloatArray:
    """Means over the bins between consecutive query times; NaN where a bin is not covered."""
    dt = np.diff(cum.times_s)
    d_int = np.diff(cum.integral)
    d_unc = np.diff(cum.uncovered_s)
    a, b = cum.span_s
    inside = (cum.times_s[:-1] >= a - tolerance) & (cum.times_s[1:] <= b + tolerance)
    ok = inside & (d_unc <= tolerance * np.maximum(dt, 1.0)) & (dt > 0)
    out = np.full(dt.shape, np.nan)
    out[ok] = d_int[ok] / dt[ok]
    return out


def grid_edges(t0_s: float, t1_s: float, rate_hz: float) -> FloatArray:
    """Edges of bins of 1/rate s covering [t0, t1] (the last partial bin dropped)."""
    if rate_hz <= 0 or t1_s <= t0_s:
        raise UsageError(f"empty grid: {t0_s:.3f}..{t1_s:.3f} s at {rate_hz} Hz")
    n = int(np.floor((t1_s - t0_s) * rate_hz + 1e-9))
    return t0_s + np.arange(n + 1) / rate_hz


def span_s(view: SourceView) -> tuple[float, float]:
    """(first, last) sample time of a source in session seconds."""
    n = len(view)
    if n == 0:
        raise RunFileError(f"source {view.source_id!r} has no samples")
    return view.time_slice(0, 1)[0] / 1e9, view.time_slice(n - 1, n)[0] / 1e9


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
    limit = gap_factor * median_spacing_s(view)
    cum = cumulative_at(
        chunks_s(view, channel), edges_s, limit if limit > 0 else np.inf,
        known_gaps_s(run, view.source_id), hold=hold,
    )
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
        import pandas as pd

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

    def to_json(self) -> dict[str, float]:
        return {"lag_s": self.lag_s, "correlation": self.correlation,
                "confidence": self.confidence, "uncertainty_s": self.uncertainty_s}


def _xcorr(ref: FloatArray, target: FloatArray, max_lag: int) -> FloatArray:
    """Normalised cross-correlation for lags −max..max (NaN-aware, by FFT)."""
    ok_r, ok_t = np.isfinite(ref), np.isfinite(target)
    r = np.where(ok_r, ref - np.nanmean(ref), 0.0)
    x = np.where(ok_t, target - np.nanmean(target), 0.0)
    n = r.size
    size = 1 << int(np.ceil(np.log2(2 * n)))

    def corr(a: FloatArray, b: FloatArray) -> FloatArray:
        full = np.fft.irfft(np.conj(np.fft.rfft(a, size)) * np.fft.rfft(b, size), size)
        return np.concatenate((full[size - max_lag:], full[: max_lag + 1]))

    num = corr(r, x)
    e_r = corr(r * r, ok_t.astype(np.float64))
    e_x = corr(ok_r.astype(np.float64), x * x)
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
