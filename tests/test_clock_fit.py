"""Device clock → host clock: the lower-envelope fit against latency-jittered host stamps."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wattlab.device_models.clock_fit import EnvelopeAccumulator, fit_lower_envelope, lower_hull
from wattlab.errors import UsageError
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, SourceDescriptor

pytestmark = pytest.mark.fast


def jittered(n: int, drift_ppm: float, seed: int = 0, rate_hz: float = 20_000.0):
    """A µs device counter and host read times = truth + latency (only ever late)."""
    rng = np.random.default_rng(seed)
    dev_us = 1_000_000 + np.arange(n, dtype=np.int64) * int(1e6 / rate_hz)
    truth = 7_000_000_000 + ((dev_us - dev_us[0]) * 1000 / (1 + drift_ppm * 1e-6))
    latency = 30_000 + rng.exponential(300_000, n)  # 30 µs floor, 300 µs mean
    return dev_us, truth, (truth + latency).astype(np.int64)


def test_lower_envelope_recovers_offset_and_drift_far_better_than_least_squares():
    dev_us, truth, host = jittered(100_000, drift_ppm=40.0)
    fit = fit_lower_envelope(dev_us, host, nominal_ns_per_unit=1000.0)
    err = fit.to_host_ns(dev_us) - truth
    assert fit.drift_ppm == pytest.approx(40.0, abs=0.05)
    # only the latency floor (30 µs) remains, as a constant: it cannot be seen from the data
    assert np.ptp(err) < 2_000
    assert abs(np.median(err) - 30_000) < 2_000
    slope, intercept = np.polyfit(dev_us - dev_us[0], host - truth[0], 1)
    ls_err = intercept + slope * (dev_us - dev_us[0]) - (truth - truth[0])
    assert np.median(np.abs(ls_err)) > 100 * np.median(np.abs(err - 30_000))


def test_residuals_are_never_negative_and_summarised():
    dev_us, _, host = jittered(5_000, drift_ppm=-12.0, seed=3)
    fit = fit_lower_envelope(dev_us, host, 1000.0)
    resid = fit.residuals_ns(dev_us, host)
    assert resid.min() > -1.0
    fit = fit.with_residuals(resid)
    assert 0 < fit.residual_p50_ns < fit.residual_p99_ns <= fit.residual_max_ns
    attrs = fit.to_attrs()
    assert attrs["method"] == "lower_envelope" and attrs["n_points"] == 5_000


def test_chunked_accumulator_gives_the_same_fit():
    dev_us, _, host = jittered(60_000, drift_ppm=7.5, seed=5)
    whole = fit_lower_envelope(dev_us, host, 1000.0)
    acc = EnvelopeAccumulator(1000.0)
    for start in range(0, dev_us.size, 7_000):
        acc.add(dev_us[start:start + 7_000], host[start:start + 7_000])
    chunked = acc.fit()
    assert chunked is not None
    np.testing.assert_allclose(chunked.to_host_ns(dev_us), whole.to_host_ns(dev_us), atol=2)


def test_unix_microsecond_clock_keeps_precision():
    """NVML stamps are unix µs (~1.7e15): everything is relative, nothing is lost to float."""
    dev_us = 1_763_000_000_000_000 + np.arange(0, 2_000_000, 20_000, dtype=np.int64)
    host = 5_000_000_000 + (dev_us - dev_us[0]) * 1000 + 123
    fit = fit_lower_envelope(dev_us, host, 1000.0)
    np.testing.assert_array_equal(fit.to_host_ns(dev_us), host)
    assert fit.drift_ppm == pytest.approx(0.0, abs=1e-9)


def test_bad_input_is_a_usage_error():
    with pytest.raises(UsageError, match="equal 1-D"):
        fit_lower_envelope(np.arange(3), np.arange(4))
    with pytest.raises(UsageError, match="tick"):
        fit_lower_envelope(np.arange(3), np.arange(3), nominal_ns_per_unit=0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(-10_000, 10_000)),
                min_size=1, max_size=60))
def test_hull_line_stays_below_every_point(points):
    """Whatever the points, the fitted line is under all of them (the LP's constraint)."""
    x = np.array([p[0] for p in points], dtype=np.int64)
    y = np.array([p[1] for p in points], dtype=np.int64)
    fit = fit_lower_envelope(x, y, 1.0)
    assert fit.residuals_ns(x, y).min() > -1e-6 * (1 + np.abs(y).max())
    order = np.lexsort((y, x))
    hull = lower_hull(x[order].astype(float), y[order].astype(float))
    assert len(hull) >= 1


def test_recorder_close_stores_the_fit_for_device_clocked_sources(tmp_path):
    path = str(tmp_path / "run.h5")
    writer = RunFileWriter(path, {}, session_start_ns=1_000)
    desc = SourceDescriptor("ps3", "powersensor3", "PS3", (Channel("power_w", "W"),),
                            time_raw="device_us_unwrapped")
    writer.add_source(desc)
    writer.add_source(SourceDescriptor("plain", "test", "x", (Channel("p_w", "W"),)))
    dev_us, _, host = jittered(30_000, drift_ppm=25.0, seed=9)
    values = np.zeros((dev_us.size, 1))
    flags = np.zeros(dev_us.size, dtype=np.uint8)
    writer.append("ps3", host, dev_us, values, flags)
    writer.append("plain", host, host, values, flags)
    writer.close({"done": 1})
    with h5py.File(path) as f:
        attrs = dict(f["sources/ps3/clock_fit"].attrs)
        assert attrs["drift_ppm"] == pytest.approx(25.0, abs=0.5)
        assert attrs["residual_p50_ns"] > 0
        assert "clock_fit" not in f["sources/plain"]
