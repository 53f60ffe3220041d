"""``wattlab_power_valid``: the live part of the verdict, per stream, as the exporter shows it."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from wattlab.samples import Channel, SourceDescriptor
from wattlab.sync.recorder.prometheus import families
from wattlab.sync.recorder.stream_metrics import StreamMetrics

pytestmark = pytest.mark.fast


def _valid(metrics: StreamMetrics) -> dict[str, float]:
    (family,) = [f for f in families(metrics.snapshot(), CounterMetricFamily,
                                     GaugeMetricFamily) if f.name == "wattlab_power_valid"]
    return {s.labels["source"]: s.value for s in family.samples}


def _metrics() -> StreamMetrics:
    metrics = StreamMetrics(unix_minus_monotonic_ns=0)
    for sid in ("good", "back", "nan", "gap"):
        metrics.describe(SourceDescriptor(sid, "meter", "m", (Channel("power_w", "W"),)))
        metrics.add_rows(sid, np.arange(0, 10, dtype=np.int64) * 1_000_000,
                         np.full((10, 1), 100.0))
    return metrics


def test_each_stream_is_valid_until_its_time_steps_back_a_value_is_lost_or_a_gap():
    metrics = _metrics()
    assert _valid(metrics) == {"good": 1, "back": 1, "nan": 1, "gap": 1}
    metrics.add_rows("good", np.array([10_000_000, 11_000_000]), np.full((2, 1), 100.0))
    metrics.add_rows("back", np.array([5_000_000, 6_000_000]), np.full((2, 1), 100.0))
    metrics.add_rows("nan", np.array([10_000_000, 11_000_000]), np.array([[100.0], [np.nan]]))
    metrics.add_gap("gap")
    assert _valid(metrics) == {"good": 1, "back": 0, "nan": 0, "gap": 0}
