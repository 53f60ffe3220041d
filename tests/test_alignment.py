"""Alignment: grids keep gaps, lags are found by cross-correlation (also on real H100 data)."""

from __future__ import annotations

import numpy as np
import pytest

import wattlab
from wattlab.analysis.alignment import (
    Cumulative,
    StreamIntegral,
    _xcorr,
    aligned,
    estimate_lag,
    grid_edges,
    json_safe,
    parse_spec,
)
from wattlab.errors import UsageError
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Gap, SourceDescriptor

pytestmark = pytest.mark.fast


def test_lag_of_a_shifted_random_load_is_found_to_a_millisecond():
    rng = np.random.default_rng(3)
    rate = 1000.0
    x = np.repeat(rng.uniform(50, 700, 400), rng.integers(20, 300, 400))[:60_000]
    shift = 43
    y = np.concatenate([np.full(shift, x[0]), x[:-shift]]) + rng.normal(0, 3, x.size)
    lag = estimate_lag(x, y, rate, max_lag_s=1.0)
    assert lag.lag_s == pytest.approx(0.043, abs=1e-3)
    assert lag.correlation > 0.95 and lag.confidence > 0.3
    assert lag.uncertainty_s < 2e-3


def test_unrelated_streams_have_low_confidence():
    rng = np.random.default_rng(4)
    x = np.repeat(rng.uniform(50, 700, 300), 100)
    y = np.repeat(rng.uniform(50, 700, 300), 100)
    assert estimate_lag(x, y, 100.0, max_lag_s=2.0).correlation < 0.5


def test_aligned_keeps_gaps_as_nan(tmp_path):
    path = tmp_path / "a.h5"
    w = RunFileWriter(str(path), {}, 0)
    for sid, step_ms in (("fast", 1), ("slow", 20)):
        w.add_source(SourceDescriptor(sid, "meter", "m", (Channel("power_w", "W"),)))
        t = np.arange(0, 10_000, step_ms) * 1_000_000
        if sid == "fast":
            t = t[(t < 3_000_000_000) | (t > 5_000_000_000)]
        w.append(sid, t, t, np.full((t.size, 1), 50.0), np.zeros(t.size, np.uint8))
    w.add_gaps([Gap("slow", "lost", 1, 2, 7_000_000_000, 7_500_000_000, 25)])
    w.close()
    with wattlab.open(str(path)) as run:
        al = aligned(run, 10.0, "fast", "slow:power_w")
    fast, slow = al.values["fast"], al.values["slow:power_w"]
    hole = (al.t_s > 3.0) & (al.t_s < 5.0)
    away = (np.abs(al.t_s - 3.0) > 0.1) & (np.abs(al.t_s - 5.0) > 0.1) & (al.t_s < 9.9)
    assert np.all(np.isnan(fast[hole])) and np.allclose(fast[~hole & away], 50.0)
    assert np.all(np.isnan(slow[(al.t_s > 7.05) & (al.t_s < 7.45)]))
    assert np.isfinite(slow[(al.t_s > 1) & (al.t_s < 6.9)]).all()
    assert al.to_pandas().shape[1] == 2


def test_spec_parsing():
    assert parse_spec("gpu0.power:average_power_w") == ("gpu0.power", "average_power_w")
    assert parse_spec("meter") == ("meter", None)
    with pytest.raises(UsageError):
        parse_spec(":x")


def test_h100_views_lag_the_sample_buffer_as_measured(h100_run):
    with wattlab.open(str(h100_run)) as run:
        al = aligned(run, 200.0, "h100.samples", "h100.instant", "h100.average", hold=True)
    ref = al.values["h100.samples"]
    inst = estimate_lag(ref, al.values["h100.instant"], 200.0, max_lag_s=2.0)
    avg = estimate_lag(ref, al.values["h100.average"], 200.0, max_lag_s=2.0)
    assert 0.03 < inst.lag_s < 0.08  # instant: ~55-75 ms behind the load, samples ~25 ms
    assert 0.45 < avg.lag_s < 0.6  # a 1 s boxcar: centred half a second late
    for view in ("h100.instant", "h100.average"):
        assert np.nanmean(al.values[view]) / np.nanmean(ref) == pytest.approx(1.0, abs=0.01)


def test_h100_views_lag_the_load_schedule_as_the_data_readme_states(h100_run):
    """Issue 5: against the load edges themselves, ~25 ms, ~55-75 ms and ~550 ms."""
    rate_hz = 200.0
    with wattlab.open(str(h100_run)) as run:
        al = aligned(run, rate_hz, "h100.samples", "h100.instant", "h100.average", hold=True)
        edges = sorted((m.time_ns, m.payload["level"]) for m in run.markers
                       if m.kind == "begin" and m.source == "load")
    edge_s = np.array([t for t, _ in edges]) / 1e9
    levels = np.array([lv for _, lv in edges], dtype=np.float64)
    at = np.searchsorted(edge_s, al.t_s, side="right") - 1
    schedule = np.where(at >= 0, levels[np.maximum(at, 0)], 0.0)
    lags_s = {}
    for view in ("h100.samples", "h100.instant", "h100.average"):
        power = al.values[view]
        ok = np.isfinite(power)
        filled = np.where(ok, power, np.nanmean(power))
        lags_s[view] = estimate_lag(schedule, filled, rate_hz, max_lag_s=2.0,
                                    min_lag_s=0.0).lag_s
    assert 0.010 < lags_s["h100.samples"] < 0.045, lags_s
    assert 0.045 < lags_s["h100.instant"] < 0.090, lags_s
    assert 0.45 < lags_s["h100.average"] < 0.65, lags_s


class _SegmentBySegment(StreamIntegral):
    """The general path (per-segment trapezoids) for every slice, whatever the stream."""

    def _block(self, t: np.ndarray, values: np.ndarray) -> None:
        a = int(np.searchsorted(self._q, t[0], side="left"))
        b = int(np.searchsorted(self._q, t[-1], side="right"))
        for c, col in enumerate(self.columns):
            self._slow(c, t, np.diff(t), values[:, col], rows=(a, b))


def _riser(hole: bool) -> tuple[np.ndarray, np.ndarray]:
    """10 s of a 20 kHz 3-channel float32 stream in int64 ns, optionally with a 50 ms hole."""
    rng = np.random.default_rng(10)
    t = np.arange(200_000, dtype=np.int64) * 50_000 + 123_000_000
    v = (rng.uniform(50, 600, (t.size, 3)) + np.sin(t[:, None] / 3e6)).astype("<f4")
    if hole:
        keep = np.ones(t.size, dtype=bool)
        keep[90_000:91_000] = False
        t, v = t[keep], v[keep]
    return t, v


@pytest.mark.parametrize("hole", [False, True])
@pytest.mark.parametrize("hold", [False, True])
def test_block_sums_match_the_segment_by_segment_integral(hole: bool, hold: bool) -> None:
    # a 1 kHz grid from the first sample: queries fall on samples (up to float rounding) and
    # slices of 2^15 rows end inside bins; then a grid off the samples
    t, v = _riser(hole)
    for start_s in (0.123, 0.1234567):
        q = grid_edges(start_s, t[-1] / 1e9, 1000.0)
        fast = StreamIntegral(q, [0, 2], 250_000, hold=hold, per_s=1e9)
        general = _SegmentBySegment(q, [0, 2], 250_000, hold=hold, per_s=1e9)
        for s in range(0, t.size, 1 << 15):
            fast.feed(t[s:s + (1 << 15)], v[s:s + (1 << 15)])
            general.feed(t[s:s + (1 << 15)], v[s:s + (1 << 15)])
        for f, g in zip(fast.result(), general.result(), strict=True):
            np.testing.assert_allclose(f.integral, g.integral, rtol=1e-12, atol=1e-9)
            np.testing.assert_array_equal(f.uncovered_s, g.uncovered_s)
            assert f.gaps_s == g.gaps_s and f.n_gaps == (1 if hole else 0)
            # energies of 1 s windows (the rows `energy` reports) to 1e-12
            e_f, e_g = f.integral[1000::1000] - f.integral[:-1000:1000], \
                g.integral[1000::1000] - g.integral[:-1000:1000]
            np.testing.assert_allclose(e_f, e_g, rtol=1e-12)


def _assert_window_extremes(cum: Cumulative, t: np.ndarray, values: np.ndarray,
                            windows_ns: np.ndarray) -> None:
    """Each window's lowest and highest finite value is what numpy finds in its rows."""
    for w, (lo, hi) in enumerate(windows_ns):
        sel = values[(t >= lo) & (t < hi)]
        sel = sel[np.isfinite(sel)]
        expect = (sel.min(), sel.max()) if sel.size else (np.inf, -np.inf)
        assert (cum.window_min[w], cum.window_max[w]) == expect, w


def test_recorded_gaps_and_window_extremes_in_one_pass_match_the_general_path() -> None:
    # a hole by spacing, two recorded gaps (one inside a run of samples, one overlapping
    # the hole) and a NaN in one channel: the block sums must give what the segment by
    # segment path gives, and each window's lowest/highest finite value what numpy finds
    t, v = _riser(hole=True)
    v = v.astype(np.float64)
    v[120_000, 2] = np.nan
    gaps = [(int(t[30_000]) + 10, int(t[30_004]) - 10), (int(t[89_990]), int(t[90_005]))]
    q = grid_edges(0.2, t[-1] / 1e9, 7.0)
    windows_ns = np.array([[t[0], t[-1] + 1], [t[29_000], t[31_000]], [t[100], t[100]],
                           [t[119_000], t[125_000]], [t[-1] + 5, t[-1] + 9]], dtype=np.int64)
    fast = StreamIntegral(q, [0, 2], 250_000, known_gaps=gaps, per_s=1e9, windows=windows_ns)
    general = _SegmentBySegment(q, [0, 2], 250_000, known_gaps=gaps, per_s=1e9)
    for s in range(0, t.size, 40_000):
        fast.feed(t[s:s + 40_000], v[s:s + 40_000])
        general.feed(t[s:s + 40_000], v[s:s + 40_000])
    for col, f, g in zip([0, 2], fast.result(), general.result(), strict=True):
        np.testing.assert_allclose(f.integral, g.integral, rtol=1e-12, atol=1e-9)
        np.testing.assert_array_equal(f.uncovered_s, g.uncovered_s)
        np.testing.assert_allclose(f.bridge, g.bridge, rtol=1e-12, atol=1e-9)
        np.testing.assert_array_equal(f.unbridged_s, g.unbridged_s)
        assert f.gaps_s == g.gaps_s and f.n_gaps >= 3
        _assert_window_extremes(f, t, v[:, col], windows_ns)


def test_window_extremes_of_chunks_wholly_inside_windows_skip_non_finite_values() -> None:
    # chunks that every window holds whole or not at all take a shortcut (one fold per
    # chunk): a NaN, an inf and a chunk with no finite value in one channel must not count
    t, v = _riser(hole=False)
    v = v.astype(np.float64)
    v[50_000, 0], v[60_000, 2] = np.nan, np.inf
    v[80_000:120_000, 2] = np.nan
    windows_ns = np.array([[t[0], t[-1] + 1], [t[40_000], t[120_000]],
                           [t[80_000], t[120_000]]], dtype=np.int64)
    fast = StreamIntegral([0.2, 5.0], [0, 2], 250_000, per_s=1e9, windows=windows_ns)
    for s in range(0, t.size, 40_000):
        fast.feed(t[s:s + 40_000], v[s:s + 40_000])
    for col, f in zip([0, 2], fast.result(), strict=True):
        _assert_window_extremes(f, t, v[:, col], windows_ns)


def test_json_safe_makes_plain_strict_json_values() -> None:
    # plain floats, ints and strings take a shortcut; numpy scalars, bools, non-finite
    # values, tuples and non-string keys must still come out as strict JSON's types
    record = {"e": 1.5, "nan": float("nan"), "inf": np.float64(np.inf), "n": 3, 4: "key",
              "np": [np.int64(7), np.float32(0.25), np.bool_(True), True, None],
              "t": (np.float64(-0.0), {"x": [float("-inf")]})}
    out = json_safe(record)
    assert out == {"e": 1.5, "nan": None, "inf": None, "n": 3, "4": "key",
                   "np": [7, 0.25, True, True, None], "t": [-0.0, {"x": [None]}]}
    assert [type(v) for v in out["np"]] == [int, float, bool, bool, type(None)]
    assert type(out["t"][0]) is float


def test_cross_correlation_without_holes_matches_the_masked_ffts() -> None:
    # the normalising energies come from running sums when a stream has no hole
    rng = np.random.default_rng(12)
    x = np.cumsum(rng.normal(size=3000)) + 100
    y = np.roll(x, 25) + rng.normal(0, 0.1, x.size)
    n, max_lag = x.size, 200
    r, z = x - x.mean(), y - y.mean()
    lags = np.arange(-max_lag, max_lag + 1)
    brute = []
    for lag in lags:  # overlap of r[i] and z[i + lag]
        i = np.arange(max(0, -lag), min(n, n - lag))
        brute.append(r[i] @ z[i + lag] / np.sqrt((r[i] @ r[i]) * (z[i + lag] @ z[i + lag])))
    np.testing.assert_allclose(_xcorr(x, y, max_lag), brute, atol=1e-12)
    y_hole = y.copy()
    y_hole[1000:1100] = np.nan
    assert np.all(np.isfinite(_xcorr(x, y_hole, max_lag)))


def test_prefetched_slices_are_the_slices_read_in_turn(tmp_path):
    # the background read fills the other buffers: every slice arrives intact and in order
    path = tmp_path / "p.h5"
    w = RunFileWriter(str(path), {}, 0)
    w.add_source(SourceDescriptor("m", "meter", "m", (Channel("a_w", "W"), Channel("b_w", "W"))))
    t = np.arange(1_000, dtype=np.int64) * 1_000_000
    v = np.column_stack([np.arange(t.size), -np.arange(t.size)]).astype(np.float64)
    w.append("m", t, t, v, np.zeros(t.size, np.uint8))
    w.close()
    with wattlab.open(str(path)) as run:
        view = run.source("m")
        plain = [(a.copy(), b.copy()) for a, b in view.iter_rows(96)]
        ahead = [(a.copy(), b.copy()) for a, b in view.iter_rows(96, prefetch=True)]
        first = next(iter(view.iter_rows(96, prefetch=True)))[0].copy()  # left early
        over = {prefetch: [(a.copy(), b.copy()) for a, b in view.iter_rows(
            96, prefetch=prefetch, overlap=True)] for prefetch in (False, True)}
    assert len(ahead) == len(plain) == 11 and first[0] == 0
    for (ta, va), (tb, vb) in zip(plain, ahead, strict=True):
        np.testing.assert_array_equal(ta, tb)
        np.testing.assert_array_equal(va, vb)
    np.testing.assert_array_equal(np.concatenate([a for a, _ in ahead]), t)
    # overlapping slices: each after the first starts with the row the one before ended with
    for slices in over.values():
        assert len(slices) == 11
        assert all(slices[k][0][0] == slices[k - 1][0][-1] for k in range(1, 11))
        np.testing.assert_array_equal(
            np.concatenate([slices[0][1]] + [b[1:] for _, b in slices[1:]]), v)
