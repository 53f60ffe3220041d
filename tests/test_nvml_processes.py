"""The NVML reader's gpu{i}.processes stream on the simulated shared GPU, on a fake clock:
the fake answers as nvidia-ml-py does, the reads share the state wake-ups, a refusal is a
missing reading and a failure mid-run a Gap, and the truth adds up (docs/processes.md)."""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import numpy as np
import pynvml
import pytest

from tests.test_nvml_source import UNIX_MINUS_MONO, FakeClock, run_for
from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.acquirers.nvml_acquirer import NVML_STREAMS, NvmlAcquirer, parse_streams
from wattlab.acquisition.acquirers.nvml_cadence import parse_intervals
from wattlab.drivers.nvml import NvmlDriver
from wattlab.drivers.nvml_samples import process_samples
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.shared_gpu import Phase, SharedLoad, SimProcess, shared_simulated_gpu
from wattlab.hardware.simulated_gpu import SimulatedGpu
from wattlab.samples import Gap, Marker

S = 1_000_000_000


def shared(count: int = 3, span_s: float = 20.0, **fake: Any
           ) -> tuple[FakeNvml, SimulatedGpu, FakeClock]:
    clock = FakeClock()
    gpu = shared_simulated_gpu(count, 5, span_s, lead_s=0.0, clock_ns=clock, start_ns=clock(),
                               unix_offset_ns=UNIX_MINUS_MONO)
    return FakeNvml([gpu], **fake), gpu, clock


def reader(lib: FakeNvml, clock: FakeClock, **kwargs: Any) -> NvmlAcquirer:
    return NvmlAcquirer(NvmlDriver(lib), 0, clock_ns=clock, wall_clock_ns=clock.wall,
                        sleep=clock.sleep, **kwargs)


def rows(readings: list[Any]) -> np.ndarray:
    got = [r.values for r in readings if isinstance(r, Chunk) and r.source_id == "gpu0.processes"]
    return np.concatenate(got) if got else np.zeros((0, 6))


@pytest.mark.fast
def test_the_fake_answers_as_nvidia_ml_py_does():
    lib, _, clock = shared()
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotFound):  # no sample yet: NOT_FOUND, not []
        lib.nvmlDeviceGetProcessUtilization(h, 0)
    clock.t_ns += 5 * S
    got = lib.nvmlDeviceGetProcessUtilization(h, 0)
    assert isinstance(got, list) and type(got[0]) is pynvml.c_nvmlProcessUtilizationSample_t
    last = max(s.timeStamp for s in got)
    with pytest.raises(pynvml.NVMLError_NotFound):
        lib.nvmlDeviceGetProcessUtilization(h, last)
    procs = lib.nvmlDeviceGetComputeRunningProcesses(h)
    assert {p.pid for p in procs} == {4100, 4137, 4174}
    assert all(isinstance(p.usedGpuMemory, int) for p in procs)
    assert lib.nvmlDeviceGetGraphicsRunningProcesses(h) == []
    assert len({s.pid for s in got}) == len(got)  # one sample per process, its newest
    stamps = set()
    for _ in range(60):  # read faster than the driver samples: every sample it takes
        clock.t_ns += S // 20
        with contextlib.suppress(pynvml.NVMLError_NotFound):  # no sample since: none new
            stamps |= {s.timeStamp for s in lib.nvmlDeviceGetProcessUtilization(h, last)}
            last = max(stamps)
    assert 150_000 < np.median(np.diff(sorted(stamps))) < 185_000  # ~1/6 s, jittered
    assert ctypes.sizeof(got[0]) == ctypes.sizeof(pynvml.c_nvmlProcessUtilizationSample_t)


@pytest.mark.fast
def test_the_stream_is_on_by_default_and_shares_the_state_wake_ups():
    lib, _, clock = shared()
    acq = reader(lib, clock)
    ids = [d.source_id for d in acq.open()]
    assert "gpu0.processes" in ids and parse_streams("all") == NVML_STREAMS
    with_processes = run_for(acq, clock, 12.0)
    woke_with = list(clock.sleeps)
    lib2, _, clock2 = shared()
    acq2 = reader(lib2, clock2, streams="samples,power,energy,state")
    assert "gpu0.processes" not in [d.source_id for d in acq2.open()]
    assert rows(run_for(acq2, clock2, 12.0)).shape[0] == 0
    assert clock2.sleeps == woke_with  # not one wake-up more
    got = rows(with_processes)
    assert set(got[:, 0].astype(int)) == {4100, 4137, 4174}
    assert (got[:, 1] > 0).any() and np.isfinite(got).all()


@pytest.mark.fast
def test_a_shorter_processes_interval_sees_more_of_the_drivers_samples():
    """The driver answers one sample per process a call: reading every 0.18 s instead of
    0.9 s sees about five times as many of them (``--nvml-intervals processes=0.18``)."""
    counts = {}
    for interval_s in (0.9, 0.18):
        lib, _, clock = shared()
        acq = reader(lib, clock, intervals_s={"processes": interval_s})
        acq.open()
        got = rows(run_for(acq, clock, 14.0))
        busy = got[got[:, 1] > 0]
        counts[interval_s] = max(np.sum(busy[:, 0] == pid) for pid in set(busy[:, 0]))
    assert counts[0.18] > 3 * counts[0.9] > 0, counts
    assert parse_intervals("processes=0.18") == {"processes": 0.18}


@pytest.mark.fast
@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED,
                                  pynvml.NVML_ERROR_NO_PERMISSION])
def test_a_gpu_refusing_the_query_has_no_stream_and_says_why(code):
    lib, _, clock = shared(process_query_error=code)
    acq = reader(lib, clock)
    descriptors = acq.open()
    assert "gpu0.processes" not in [d.source_id for d in descriptors]
    assert str(pynvml.NVMLError(code)) in descriptors[0].config["missing"]["processes"]
    assert rows(run_for(acq, clock, 3.0)).shape[0] == 0  # never a stream of zeros


@pytest.mark.fast
def test_a_query_failing_mid_run_is_a_gap_with_nvml_s_reason_then_reads_resume():
    lib, _, clock = shared()
    acq = reader(lib, clock)
    acq.open()
    before = rows(run_for(acq, clock, 4.0))
    lib.process_query_error = pynvml.NVML_ERROR_GPU_IS_LOST
    failed = run_for(acq, clock, 2.0)
    gaps = [r for r in failed if isinstance(r, Gap) and r.source == "gpu0.processes"]
    assert gaps and "GPU is lost" in gaps[0].reason
    assert gaps[0].t_first_ns < gaps[0].t_last_ns
    lib.process_query_error = None
    assert rows(run_for(acq, clock, 2.0)).shape[0] > 0 and before.shape[0] > 0


@pytest.mark.fast
def test_identity_markers_exits_and_the_truth_marker_from_the_simulator():
    lib, gpu, clock = shared(count=2, span_s=10.0)
    acq = reader(lib, clock)
    acq.open()
    open_ns = clock()
    out = run_for(acq, clock, 12.0)
    markers = [r for r in out if isinstance(r, Marker)]
    names = [(m.name, m.payload["pid"]) for m in markers if m.name != "simulated-truth"]
    assert names == [("process", 4100), ("process", 4137), ("process-exit", 4100),
                     ("process-exit", 4137)]
    assert markers[0].payload["slurm_job"] == "7001" and markers[0].payload["comm"] == (
        "sim-matmul")
    assert markers[1].payload["pod_uid"] is not None  # the odd ones are pods
    (truth,) = [m for m in markers if m.name == "simulated-truth"]
    t0, t1 = truth.payload["window_ns"]
    assert t0 == open_ns and t1 == truth.t_host_ns
    total = truth.payload["idle_j"] + truth.payload["static_j"] + sum(
        truth.payload["dynamic_j"].values())
    assert total == pytest.approx(gpu.true_energy_j(t0, t1), rel=1e-9)


class CountingUtilisation(FakeNvml):
    """The fake NVML, counting its per-process utilisation calls."""

    utilisation_calls = 0

    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> Any:
        self.utilisation_calls += 1
        return super().nvmlDeviceGetProcessUtilization(handle, last_seen_us)


@pytest.mark.fast
def test_utilisation_is_read_only_while_two_or_more_processes_share_the_gpu():
    # a alone for 2 s: no rows (its activity is the device's, the state stream's
    # gpu_util_pct), no utilisation call; b joins at 2 s: both get rows from the call;
    # a leaves at 4 s, b alone to 6 s
    clock = FakeClock()
    lib = CountingUtilisation([two_process_gpu(clock, 2.0)[0]])
    acq = reader(lib, clock)
    open_ns = clock()
    acq.open()
    probed = lib.utilisation_calls  # open asks once whether the GPU answers the query
    alone = run_for(acq, clock, 1.8)
    assert lib.utilisation_calls == probed and rows(alone).shape[0] == 0
    assert [r.payload["pid"] for r in alone
            if isinstance(r, Marker) and r.name == "process"] == [1]
    shared = run_for(acq, clock, 2.0)
    together = rows(shared)
    assert lib.utilisation_calls > probed
    assert set(together[:, 0].astype(int)) == {1, 2} and (together[:, 1] > 0).any()
    # a leaves at 4 s: the first read after it, with b alone, still asks for the samples
    # since the last read (a's last work); the reads after it do not
    after = run_for(acq, clock, 3.0)
    a_rows = [r.t_host_ns[r.values[:, 0] == 1] for r in shared + after
              if isinstance(r, Chunk) and r.source_id == "gpu0.processes"]
    last_a_s = (max(int(t.max()) for t in a_rows if t.size) - open_ns) / S
    assert last_a_s > 4.0 - 0.2, last_a_s  # within a driver period of its end
    calls = lib.utilisation_calls
    assert rows(run_for(acq, clock, 1.8)).shape[0] == 0 and lib.utilisation_calls == calls


@pytest.mark.fast
def test_the_last_sample_of_a_process_that_left_a_shared_gpu_is_read():
    # the driver stamps a's last sample up to a period after its end; the read that saw a
    # gone (not listed, no new sample) may come before that stamp, and b alone is not read:
    # a later read must fetch it. Read every 0.15 s, two reads fall in one driver period
    # now and then: the simulated GPU lost a copy's last 0.1 s of work (25 J) so
    missed = []
    for a_end_s in 4.0 + 0.02 * np.arange(60):  # a's end over eight driver periods
        clock = FakeClock()
        gpu, load = two_process_gpu(clock, 2.0, float(a_end_s))
        acq = reader(FakeNvml([gpu]), clock, intervals_s={"processes": 0.15})
        open_ns = clock()
        acq.open()
        got = run_for(acq, clock, a_end_s + 2.0)
        stamps = load.sample_times_s(np.arange(1, 100))
        last = int(np.searchsorted(stamps, a_end_s))  # the sample a's end falls in
        if a_end_s - stamps[last - 1] < 0.005:
            continue  # a's part of it rounds to 0 %: the driver does not list a in it
        a_s = np.concatenate([(r.t_host_ns[r.values[:, 0] == 1] - open_ns) / S for r in got
                              if isinstance(r, Chunk) and r.source_id == "gpu0.processes"])
        if abs(a_s.max() - stamps[last]) > 1e-6:
            missed.append((round(float(a_end_s), 2), float(a_s.max()), float(stamps[last])))
    assert missed == []


def two_process_load(start_b_s: float, a_end_s: float = 4.0) -> SharedLoad:
    a = SimProcess(1, "a", 0.0, (Phase(a_end_s, 60, 10, 250.0),))
    b = SimProcess(2, "b", start_b_s, (Phase(4.0, 40, 40, 200.0),))
    return SharedLoad([a, b], idle_w=70.0, dynamic_w=1000.0)


def two_process_gpu(clock: FakeClock, start_b_s: float, a_end_s: float = 4.0
                    ) -> tuple[SimulatedGpu, SharedLoad]:
    load = two_process_load(start_b_s, a_end_s)
    gpu = SimulatedGpu(0, 1, load.schedule(), clock_ns=clock, start_ns=clock(),
                       unix_offset_ns=UNIX_MINUS_MONO)
    gpu.processes = load
    return gpu, load


@pytest.mark.fast
def test_overlapping_processes_saturate_toward_the_limit_and_time_slice():
    load = two_process_load(2.0)
    assert load.saturated_w(250.0) == 250.0  # alone: what it draws alone
    both = load.saturated_w(450.0)
    assert 300.0 < both < 450.0 and both < load.limit_w
    samples = load.utilisation_samples(3.9, 3.0)
    by_pid = {pid: (sm, mem) for pid, t, sm, mem in samples if t > 3.2}
    assert sum(sm for sm, _ in by_pid.values()) <= 100
    assert by_pid[1][0] / by_pid[2][0] == pytest.approx(60 / 40, rel=0.05)  # one common share


@pytest.mark.fast
def test_truth_splits_dynamic_energy_by_what_each_would_draw_alone():
    clock = FakeClock()
    gpu, load = two_process_gpu(clock, 2.0)
    t0 = clock()
    truth = load.truth(gpu, t0 + 2 * S, t0 + 4 * S)  # both alive, both working
    dyn = truth["dynamic_j"]
    assert dyn["1"] / dyn["2"] == pytest.approx(250 / 200)
    assert truth["static_j"] == pytest.approx(35.0 * 2)
    assert truth["idle_j"] == pytest.approx(70.0 * 2)
    alone = load.truth(gpu, t0, t0 + 2 * S)["dynamic_j"]
    assert alone["2"] == 0 and alone["1"] == pytest.approx(250 * 2, rel=0.02)  # ripple only


@pytest.mark.fast
@pytest.mark.parametrize(("a_s", "b_s"), [(0.0, 0.1), (1.9, 2.1), (3.0, 3.2), (5.9, 6.1),
                                          (6.0, 9.0), (3.9, 9.0), (50.0, 50.2),
                                          (-1.0, 0.05)])
def test_a_samples_mean_takes_every_segment_it_touches_and_nothing_past_the_end(a_s, b_s):
    """The mean over the segments a sample touches equals the mean over all segments (the
    demo once failed at the schedule's end, where the touched range ran past the last edge)."""
    load = two_process_load(2.0)
    lo, hi = np.clip(load.edges_s[:-1], a_s, b_s), np.clip(load.edges_s[1:], a_s, b_s)
    busiest = np.maximum(load.sm_pct.sum(1), load.mem_pct.sum(1))[:, None]
    share = np.minimum(1.0, 100.0 / np.maximum(busiest, 1e-9))
    everything = (load.sm_pct * share * (hi - lo)[:, None]).sum(0) / (b_s - a_s)
    assert load._mean_over(a_s, b_s)[0] == pytest.approx(everything)


class SizeQuerySaysNothing:
    """pynvml's wrapper raises NVMLError(NVML_SUCCESS) when its size query finds nothing."""

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_SUCCESS)


@pytest.mark.fast
def test_pynvml_s_success_error_is_no_sample_and_other_errors_are_raised():
    assert process_samples(SizeQuerySaysNothing(), None, 0) == []
    lib, _, _ = shared(process_query_error=pynvml.NVML_ERROR_UNKNOWN)
    lib.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Unknown):
        process_samples(lib, lib.nvmlDeviceGetHandleByIndex(0), 0)
