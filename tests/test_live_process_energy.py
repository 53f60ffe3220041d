"""The live per-pod and per-job split: Kepler's rule per window, idle and static learnt
live, series per pod and job with a grace period and a cap (docs/fleet.md)."""

from __future__ import annotations

import numpy as np
import pytest

from wattlab.samples import Channel, Marker, SourceDescriptor
from wattlab.sync.recorder.live_energy.live_split import GpuLiveSplit
from wattlab.sync.recorder.live_energy.process_energy import LiveProcessEnergy
from wattlab.sync.recorder.live_energy.process_series import (
    GRACE_ENV,
    MIN_GRACE_S,
    ProcessSeries,
    grace_ns,
)
from wattlab.sync.recorder.prometheus import families

S = 1_000_000_000
PERIOD_NS = S // 6


def power_w(t_ns: np.ndarray) -> np.ndarray:
    """70 W idle; from 3 s two contexts (+35 W static); from 6 s both work (+200 W)."""
    return np.where(t_ns < 3 * S, 70.0, np.where(t_ns < 6 * S, 105.0, 305.0))


def feed(split: GpuLiveSplit, until_s: int, sm: dict[int, float]) -> dict[int, float]:
    """Half-second batches of 50 Hz power and per-process rows (from 6 s); joules by pid."""
    charged: dict[int, float] = {}
    for start in range(0, until_s * S, S // 2):
        t = np.arange(start, start + S // 2, S // 50, dtype=np.int64)
        rows_t = np.arange(max(start, 6 * S), start + S // 2, PERIOD_NS, dtype=np.int64)
        rows_t = np.repeat(rows_t, len(sm))
        pids = np.tile(np.array(list(sm), dtype=np.float64), len(rows_t) // len(sm))
        sms = np.tile(np.array(list(sm.values())), len(rows_t) // len(sm))
        split.add_processes(rows_t, pids, sms)
        for _, joules in split.add_power(t, power_w(t)):
            for pid, j in joules.items():
                charged[pid] = charged.get(pid, 0.0) + j
    return charged


def two_processes() -> GpuLiveSplit:
    split = GpuLiveSplit()
    split.presence(3 * S, 101, came=True)
    split.presence(3 * S, 202, came=True)
    return split


@pytest.mark.fast
def test_dynamic_power_above_idle_and_static_is_shared_by_sm_share():
    split = two_processes()
    charged = feed(split, 20, {101: 60.0, 202: 20.0})
    assert split.idle_w == pytest.approx(70.0, abs=0.5)
    assert split.static_w == pytest.approx(35.0, abs=0.5)
    assert charged[101] / charged[202] == pytest.approx(3.0, rel=1e-6)
    # 6 s to 16 s settled (the last 3 s wait for late rows): 200 W over 10 s, and the
    # trapezoid across the step at 6 s (20 ms from 105 W to 305 W: 2 J)
    assert charged[101] + charged[202] == pytest.approx(200 * 10 + 2, abs=0.01)


@pytest.mark.fast
def test_no_joule_is_charged_while_idle_is_not_known():
    split = GpuLiveSplit()
    split.presence(0, 101, came=True)  # a process from the start: never a stretch without one
    charged = feed(split, 12, {101: 50.0})
    assert split.idle_w is None and charged == {}


@pytest.mark.fast
def test_a_process_alone_without_rows_is_charged_the_dynamic_energy():
    # the reader reads no utilisation while one process is alone: its windows have no
    # rows, yet the device's work above idle is its own (and measures no static)
    split = GpuLiveSplit()
    split.presence(3 * S, 101, came=True)
    charged = {}
    for start in range(0, 20 * S, S // 2):
        t = np.arange(start, start + S // 2, S // 50, dtype=np.int64)
        for _, joules in split.add_power(t, power_w(t)):
            for pid, j in joules.items():
                charged[pid] = charged.get(pid, 0.0) + j
    assert split.idle_w == pytest.approx(70.0, abs=0.5) and split.static_w is None
    assert set(charged) == {101}
    # 3 s to 16 s settled, the window 2-3 s holds no process: 35 W from 3 to 6 s, 235 W
    # from 6 to 16 s, and the trapezoid across the step at 6 s (20 ms, 2 J)
    assert charged[101] == pytest.approx(35 * 3 + 235 * 10 + 2, abs=0.01)


def process(t_ns: int, pid: int, **identity: str | None) -> Marker:
    return Marker(t_ns, "process", "point", "gpu0.processes", {"gpu": 0, "pid": pid, **identity})


@pytest.mark.fast
def test_series_are_per_pod_and_job_never_per_pid_and_capped():
    series = ProcessSeries(max_series=2)
    series.arrive("gpu0", process(0, 1, pod_uid="u1", pod_name="a", pod_namespace="ns"))
    series.arrive("gpu0", process(0, 2, pod_uid="u1", pod_name="a", pod_namespace="ns"))
    series.arrive("gpu0", process(0, 3, slurm_job="77"))
    series.arrive("gpu0", process(0, 4))  # neither a pod nor a job: no series
    series.arrive("gpu0", process(0, 5, pod_uid="u2"))  # over the cap
    series.charge("gpu0", {1: 10.0, 2: 5.0, 3: 1.0, 4: 100.0, 5: 7.0})
    pods, jobs = series.figures()
    assert pods == [({"gpu": "gpu0", "pod_uid": "u1", "pod_name": "a", "namespace": "ns"}, 15.0)]
    assert jobs == [({"gpu": "gpu0", "slurm_job": "77"}, 1.0)]
    assert series.refused == 1


@pytest.mark.fast
def test_a_series_is_dropped_a_grace_period_after_its_last_process_left(monkeypatch):
    monkeypatch.setenv(GRACE_ENV, "10")
    series = ProcessSeries()
    series.arrive("gpu0", process(0, 1, pod_uid="u1"))
    series.arrive("gpu0", process(0, 2, pod_uid="u1"))
    series.leave("gpu0", 1, 5 * S)
    series.expire(100 * S)
    assert len(series.figures()[0]) == 1  # pid 2 still there
    series.leave("gpu0", 2, 20 * S)
    series.expire(29 * S)
    assert len(series.figures()[0]) == 1  # within the grace period: the final value shows
    series.expire(31 * S)
    assert series.figures()[0] == []
    series.charge("gpu0", {2: 5.0})  # a late window of a dropped pod: no series comes back
    assert series.figures()[0] == []


@pytest.mark.fast
def test_the_grace_is_never_shorter_than_a_window_takes_to_settle(monkeypatch):
    monkeypatch.setenv(GRACE_ENV, "0")
    assert grace_ns() == int(MIN_GRACE_S * 1e9)


@pytest.mark.fast
def test_a_gpu_that_refused_the_query_has_a_reason_and_no_series():
    pytest.importorskip("prometheus_client")
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from wattlab.sync.recorder.stream_metrics import StreamMetrics

    metrics = StreamMetrics(processes=True)
    metrics.describe(SourceDescriptor(
        "gpu0.samples", "nvml", "Simulated H100", (Channel("power_w", "W"),),
        config={"missing": {"processes": "Insufficient Permissions"}}))
    fams = {f.name: f for f in families(metrics.snapshot(), CounterMetricFamily,
                                        GaugeMetricFamily)}
    missing = fams["wattlab_gpu_processes_missing"].samples
    assert [(s.labels, s.value) for s in missing] == [
        ({"gpu": "gpu0", "reason": "Insufficient Permissions"}, 1)]
    assert fams["wattlab_gpu_pod_energy_joules"].samples == []
    assert fams["wattlab_gpu_idle_watts"].samples == []


@pytest.mark.fast
def test_rows_of_other_streams_and_unknown_pids_charge_nobody():
    live = LiveProcessEnergy()
    live.describe(SourceDescriptor("gpu0.processes", "nvml", "Simulated H100",
                                   (Channel("pid", "1"), Channel("sm_util_pct", "%"))))
    t = np.arange(0, 12 * S, S // 50, dtype=np.int64)
    live.add_rows("gpu0.samples", t, power_w(t)[:, None])  # not described: not routed
    assert live.figures(0).idle_w == {}


@pytest.mark.fast
def test_an_agent_without_the_markers_exposes_no_pod_or_job_series():
    pytest.importorskip("prometheus_client")
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from wattlab.sync.recorder.stream_metrics import StreamMetrics

    names = {f.name for f in families(StreamMetrics().snapshot(), CounterMetricFamily,
                                      GaugeMetricFamily)}
    assert "wattlab_energy_joules" in names and not any(n.startswith("wattlab_gpu_")
                                                        for n in names)


@pytest.mark.fast
def test_per_process_rows_after_their_window_settled_are_counted_and_exported():
    pytest.importorskip("prometheus_client")
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from wattlab.sync.recorder.stream_metrics import StreamMetrics

    metrics = StreamMetrics(processes=True)
    metrics.describe(SourceDescriptor("gpu0.samples", "nvml", "Simulated H100",
                                      (Channel("power_w", "W"),)))
    metrics.describe(SourceDescriptor("gpu0.processes", "nvml", "Simulated H100",
                                      (Channel("pid", "1"), Channel("sm_util_pct", "%"))))
    t = np.arange(0, 12 * S, S // 50, dtype=np.int64)
    metrics.add_rows("gpu0.samples", t, power_w(t)[:, None])  # windows up to 8 s settled
    # a stream that arrives late: two pids' rows in settled windows, one in an open one
    rows_t = np.array([2 * S, 4 * S, 11 * S], dtype=np.int64)
    metrics.add_rows("gpu0.processes", rows_t, np.array([[101, 50.0], [202, 50.0],
                                                         [101, 50.0]]))
    figures = metrics.snapshot().processes
    assert figures is not None and figures.late_rows == {"gpu0": 2}
    fams = {f.name: f for f in families(metrics.snapshot(), CounterMetricFamily,
                                        GaugeMetricFamily)}
    late = fams["wattlab_gpu_process_rows_late"].samples
    assert [(s.labels, s.value) for s in late] == [({"gpu": "gpu0"}, 2)]
