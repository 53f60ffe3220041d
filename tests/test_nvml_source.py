"""NvmlAcquirer: four streams from a simulated GPU, on a fake clock and briefly in real time."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pynvml
import pytest

from tests.data_files import H100_CAPTURE as REAL_DATA
from wattlab.acquisition.acquirers.acquirer import Chunk, Reading
from wattlab.acquisition.acquirers.nvml_acquirer import NvmlAcquirer, parse_streams
from wattlab.acquisition.acquirers.nvml_cadence import parse_intervals
from wattlab.analysis.calibration.stream_calibration import update_lattice
from wattlab.device_models.workload_schedule import WorkloadSchedule
from wattlab.drivers.nvml import NvmlDriver
from wattlab.errors import NvmlError, UsageError
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu
from wattlab.samples import Gap, SampleFlag

S = 1_000_000_000
UNIX_MINUS_MONO = 1_700_000_000 * S - 10**12


class FakeClock:
    """Monotonic fake time; ``sleep`` advances it and records how long each block was."""

    def __init__(self, t_ns: int = 10**12) -> None:
        self.t_ns = t_ns
        self.sleeps: list[float] = []

    def __call__(self) -> int:
        return self.t_ns

    def wall(self) -> int:
        return self.t_ns + UNIX_MINUS_MONO

    def sleep(self, dt_s: float) -> None:
        self.sleeps.append(dt_s)
        self.t_ns += round(dt_s * 1e9)


def setup(
    schedule: WorkloadSchedule | None = None,
    unsupported: frozenset[str] = frozenset(),
    **acq_kwargs: Any,
) -> tuple[NvmlAcquirer, SimulatedGpu, FakeClock]:
    clock = FakeClock()
    gpu = SimulatedGpu(
        index=0,
        seed=21,
        schedule=schedule or WorkloadSchedule.demo(21, 20.0),
        clock_ns=clock,
        unix_offset_ns=UNIX_MINUS_MONO,
        unsupported=unsupported,
    )
    acq = NvmlAcquirer(
        NvmlDriver(FakeNvml([gpu])),
        0,
        clock_ns=clock,
        wall_clock_ns=clock.wall,
        sleep=clock.sleep,
        **acq_kwargs,
    )
    return acq, gpu, clock


def run_for(acq: NvmlAcquirer, clock: FakeClock, seconds: float) -> list[Reading]:
    end = clock() + round(seconds * 1e9)
    out: list[Reading] = []
    while clock() < end:
        out += acq.poll()
    return out + acq.flush()


def by_source(readings: list[Reading]) -> dict[str, Chunk]:
    """Concatenate the chunks of each source."""
    parts: dict[str, list[Chunk]] = {}
    for r in readings:
        if isinstance(r, Chunk):
            parts.setdefault(r.source_id, []).append(r)
    out = {}
    for sid, chunks in parts.items():
        flags = [c.flags for c in chunks]
        raws = [c.t_raw for c in chunks]
        out[sid] = Chunk(
            sid,
            np.concatenate([c.t_host_ns for c in chunks]),
            np.concatenate([c.values for c in chunks]),
            t_raw=None if raws[0] is None else np.concatenate([r for r in raws if r is not None]),
            flags=None if flags[0] is None else np.concatenate([f for f in flags if f is not None]),
        )
    return out


@pytest.mark.fast
def test_descriptors_of_the_four_streams() -> None:
    acq, gpu, _ = setup()
    descs = {d.source_id: d for d in acq.open()}
    acq.close()
    assert list(descs) == ["gpu0.samples", "gpu0.power", "gpu0.energy", "gpu0.state",
                           "gpu0.processes"]  # its rows: tests/test_nvml_processes.py
    samples = descs["gpu0.samples"]
    assert samples.channels[0].name == "power_w" and samples.channels[0].unit == "W"
    assert samples.channels[0].meaning == "nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)"
    assert (samples.time_raw, samples.time_raw_dtype) == ("device_unix_us", "<i8")
    assert descs["gpu0.power"].channel_names == ["instant_power_w", "average_power_w"]
    assert descs["gpu0.energy"].channels[0].unit == "J"
    assert descs["gpu0.state"].channel_names == [
        "sm_clock_hz",
        "mem_clock_hz",
        "gpu_util_pct",
        "temperature_c",
        "power_limit_w",
    ]
    assert descs["gpu0.processes"].channel_names == [
        "pid", "sm_util_pct", "mem_util_pct", "enc_util_pct", "dec_util_pct", "used_memory_b"]
    for d in descs.values():
        assert (d.kind, d.model, d.serial, d.firmware, d.transport, d.value_dtype) == (
            "nvml",
            gpu.model.name,
            gpu.serial,
            "580.159.04",
            "nvml",
            "<f8",
        )
        assert d.config["uuid"] == gpu.uuid
        assert d.config["power_limit_range_w"] == [200.0, 700.0]
        assert d.config["missing"] == {}
        assert d.config["nvml_calls"] == {c.name: c.meaning for c in d.channels}
        assert d.config["intervals_s"]["drain"] == 0.9
        assert d.config["unix_minus_monotonic_ns"] == UNIX_MINUS_MONO
        assert d.to_json()["config"] == d.config


@pytest.mark.fast
def test_streams_on_a_fake_clock() -> None:
    acq, gpu, clock = setup()
    acq.open()
    t_open = clock()
    readings = run_for(acq, clock, 10.0)
    acq.close()
    assert not [r for r in readings if isinstance(r, Gap)]
    assert max(clock.sleeps) <= 0.1
    data = by_source(readings)

    samples = data["gpu0.samples"]
    assert samples.t_raw is not None and samples.t_raw.dtype == np.int64
    assert np.all(np.diff(samples.t_raw) > 0)  # no duplicate
    assert np.diff(samples.t_raw).max() < 30_000  # no loss (20 ms +- 3 ms jitter)
    assert samples.t_host_ns[0] >= t_open
    np.testing.assert_array_equal(samples.t_host_ns, samples.t_raw * 1000 - UNIX_MINUS_MONO)
    assert 480 <= samples.values.shape[0] <= 506  # the last poll may end a tick late

    power = data["gpu0.power"]
    assert power.values.shape[1] == 2 and 110 <= power.values.shape[0] <= 113  # every 90 ms
    assert power.flags is not None
    fresh = (power.flags & SampleFlag.REPEAT) == 0
    assert 0.85 < fresh.mean() < 0.95  # new values every 100 ms, read every 90 ms
    assert np.all(power.values > 30)
    # the poll walks through the update period, so the update instants can be recovered
    poll_s = float(np.median(np.diff(power.t_host_ns))) * 1e-9
    assert poll_s == pytest.approx(0.09, abs=1e-3)
    lattice = update_lattice(power.t_host_ns[fresh] * 1e-9, poll_s)
    assert lattice is not None
    updates_s, period_s, _ = lattice
    assert period_s == pytest.approx(0.1, abs=1e-4)
    # (the first reading is the value held at the start, not an update)
    truth_s = np.array([gpu.last_update_ns(int(t)) for t in power.t_host_ns[fresh][1:]]) * 1e-9
    # a 90 ms poll walks 10 ms a tick through the update period: it comes within 10 ms
    assert np.all((updates_s[1:] - truth_s >= 0) & (updates_s[1:] - truth_s < 0.010))

    energy = data["gpu0.energy"]
    assert np.all(np.diff(energy.values[:, 0]) >= 0)
    assert energy.values[-1, 0] - energy.values[0, 0] == pytest.approx(
        gpu.true_energy_j(int(energy.t_host_ns[0]), int(energy.t_host_ns[-1])), rel=0.02
    )

    state = data["gpu0.state"]
    assert state.values.shape[1] == 5 and 11 <= state.values.shape[0] <= 12  # every 0.9 s
    assert set(state.values[:, 0]) <= {c * 1e6 for c in gpu.model.sm_clocks_mhz}
    assert np.all(state.values[:, 1] == 2619e6)
    assert np.all(state.values[:, 4] == 700.0)


@pytest.mark.fast
def test_sample_integral_matches_energy_counter_within_2_percent() -> None:
    acq, _, clock = setup(schedule=WorkloadSchedule.random(4, 20.0))
    acq.open()
    data = by_source(run_for(acq, clock, 15.0))
    acq.close()
    samples, energy = data["gpu0.samples"], data["gpu0.energy"]
    e_t, e_j = energy.t_host_ns, energy.values[:, 0]
    assert e_t.size == 3  # at the start, after 9 s and at the end
    t0, t1 = e_t[0], e_t[-1]
    counter_j = np.interp(t1, e_t, e_j) - np.interp(t0, e_t, e_j)
    inside = (samples.t_host_ns > t0) & (samples.t_host_ns <= t1)
    integral_j = samples.values[inside, 0].sum() * 0.020
    assert integral_j == pytest.approx(counter_j, rel=0.02)


@pytest.mark.fast
def test_buffer_overflow_becomes_a_gap_without_duplicates() -> None:
    acq, _, clock = setup(intervals_s={"drain": 3.0})
    acq.open()
    readings = run_for(acq, clock, 7.0)
    acq.close()
    gaps = [r for r in readings if isinstance(r, Gap)]
    assert len(gaps) == 2
    for gap in gaps:
        assert gap.source == "gpu0.samples" and "overflowed" in gap.reason
        assert 20 <= gap.samples_lost <= 40  # ~0.6 s of a 3 s wait lost from a 2.4 s buffer
        assert 0.5 * S < gap.t_last_ns - gap.t_first_ns < 0.8 * S
    samples = by_source(readings)["gpu0.samples"]
    assert samples.t_raw is not None
    assert np.all(np.diff(samples.t_raw) > 0)


@pytest.mark.fast
def test_missing_instant_field_is_left_out_not_zeros() -> None:
    acq, _, clock = setup(
        unsupported=frozenset({"NVML_FI_DEV_POWER_INSTANT", "nvmlDeviceGetTemperature"})
    )
    descs = {d.source_id: d for d in acq.open()}
    readings = run_for(acq, clock, 1.0)
    acq.close()
    power = descs["gpu0.power"]
    assert power.channel_names == ["average_power_w"]
    assert set(power.config["missing"]) == {"instant_power_w", "temperature_c"}
    assert "temperature_c" not in descs["gpu0.state"].channel_names
    data = by_source(readings)
    assert data["gpu0.power"].values.shape[1] == 1
    assert np.all(data["gpu0.power"].values > 30)
    assert data["gpu0.state"].values.shape[1] == 4


@pytest.mark.fast
def test_gpu_without_samples_or_energy_has_no_such_streams() -> None:
    acq, _, clock = setup(
        unsupported=frozenset({"nvmlDeviceGetSamples", "nvmlDeviceGetTotalEnergyConsumption"})
    )
    ids = [d.source_id for d in acq.open()]
    readings = run_for(acq, clock, 0.5)
    acq.close()
    assert ids == ["gpu0.power", "gpu0.state", "gpu0.processes"]
    assert set(by_source(readings)) == {"gpu0.power", "gpu0.state"}  # no process: no rows


@pytest.mark.fast
def test_open_failure_is_clear_and_close_is_safe() -> None:
    lib = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    acq = NvmlAcquirer(NvmlDriver(lib), 0)
    with pytest.raises(NvmlError, match="NVML library not found"):
        acq.open()
    acq.close()


@pytest.mark.fast
def test_open_of_a_missing_gpu_releases_nvml() -> None:
    clock = FakeClock()
    gpu = SimulatedGpu(clock_ns=clock)
    lib = FakeNvml([gpu])
    acq = NvmlAcquirer(NvmlDriver(lib), 3)
    with pytest.raises(NvmlError, match="GPU 3"):
        acq.open()
    assert lib.init_count == 0
    acq.close()


@pytest.mark.system
def test_real_time_run_against_a_simulated_gpu() -> None:
    gpu = SimulatedGpu(seed=2, schedule=WorkloadSchedule.demo(2, 5.0))
    acq = NvmlAcquirer(NvmlDriver(FakeNvml([gpu])), 0, intervals_s={"drain": 0.3})
    acq.open()
    readings: list[Reading] = []
    t_end = time.monotonic() + 1.0
    longest_poll_s = 0.0
    try:
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            readings += acq.poll()
            longest_poll_s = max(longest_poll_s, time.monotonic() - t0)
        readings += acq.flush()
    finally:
        acq.close()
    assert longest_poll_s < 0.3
    data = by_source(readings)
    assert set(data) == {"gpu0.samples", "gpu0.power", "gpu0.energy", "gpu0.state"}
    assert 35 <= data["gpu0.samples"].values.shape[0] <= 55
    assert data["gpu0.power"].values.shape[0] >= 9  # every 90 ms
    now = time.monotonic_ns()
    assert np.all(data["gpu0.samples"].t_host_ns < now)
    assert np.all(data["gpu0.samples"].t_host_ns > now - 2 * S)


class FilteredNvml(FakeNvml):
    """FakeNvml whose sample buffer skips a stretch of time (a driver hole) or replays stamps."""

    def __init__(
        self,
        gpus: list[SimulatedGpu],
        drop_us: tuple[int, int] = (0, 0),
        replay: np.ndarray | None = None,
    ) -> None:
        super().__init__(gpus)
        self.drop_us = drop_us
        self.replay = replay

    def _samples_newer(self, handle: object, sampling_type: int,
                       since_us: int) -> tuple[np.ndarray, np.ndarray]:
        stamps_us, power_mw = super()._samples_newer(handle, sampling_type, since_us)
        if self.replay is not None:  # the real H100's stamps and values, as the buffer held them
            gpu = self.gpus[0]
            now_us = int(gpu.to_unix_us(gpu.clock_ns()))
            rows = self.replay[(self.replay[:, 0] <= now_us) & (self.replay[:, 0] > since_us)]
            rows = rows[-120:]
            stamps_us, power_mw = rows[:, 0], rows[:, 1]
        lo, hi = self.drop_us
        keep = ~((lo <= stamps_us) & (stamps_us < hi))
        if not keep.any():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return stamps_us[keep], power_mw[keep]


@pytest.mark.fast
def test_a_hole_in_the_driver_buffer_becomes_a_gap() -> None:
    clock = FakeClock()
    gpu = SimulatedGpu(seed=3, clock_ns=clock, unix_offset_ns=UNIX_MINUS_MONO)
    t0_us = int(gpu.to_unix_us(clock() + 2 * S))
    lib = FilteredNvml([gpu], drop_us=(t0_us, t0_us + 100_000))  # 100 ms missing
    acq = NvmlAcquirer(
        NvmlDriver(lib), 0, clock_ns=clock, wall_clock_ns=clock.wall, sleep=clock.sleep
    )
    acq.open()
    readings = run_for(acq, clock, 4.0)
    acq.close()
    gaps = [r for r in readings if isinstance(r, Gap)]
    assert len(gaps) == 1 and "hole" in gaps[0].reason
    assert 4 <= gaps[0].samples_lost <= 6
    assert gaps[0].t_last_ns - gaps[0].t_first_ns == pytest.approx(0.12 * S, abs=0.02 * S)


@pytest.mark.fast
def test_large_jitter_is_not_a_gap() -> None:
    clock = FakeClock()
    model = GpuModel(sample_jitter_s=0.009)  # intervals up to 38 ms, as seen on a real H100
    gpu = SimulatedGpu(seed=3, clock_ns=clock, unix_offset_ns=UNIX_MINUS_MONO, model=model)
    acq = NvmlAcquirer(
        NvmlDriver(FakeNvml([gpu])), 0, clock_ns=clock, wall_clock_ns=clock.wall, sleep=clock.sleep
    )
    acq.open()
    readings = run_for(acq, clock, 5.0)
    acq.close()
    assert not [r for r in readings if isinstance(r, Gap)]




@pytest.mark.fast
def test_real_h100_sample_stamps_drain_without_false_gaps() -> None:
    real = np.load(REAL_DATA)["samples"]  # stamp µs, mW, host ns when drained
    clock = FakeClock()
    first_us = int(real[0, 0])
    offset = first_us * 1000 - 50_000_000 - clock()  # open 50 ms before the first sample
    gpu = SimulatedGpu(seed=3, clock_ns=clock, unix_offset_ns=offset)
    lib = FilteredNvml([gpu], replay=real)
    acq = NvmlAcquirer(
        NvmlDriver(lib),
        0,
        clock_ns=clock,
        wall_clock_ns=lambda: clock() + offset,
        sleep=clock.sleep,
    )
    acq.open()
    span_s = (int(real[-1, 0]) - first_us) / 1e6 + 0.6
    readings = run_for(acq, clock, span_s)
    acq.close()
    assert not [r for r in readings if isinstance(r, Gap)]
    samples = by_source(readings)["gpu0.samples"]
    assert samples.t_raw is not None
    np.testing.assert_array_equal(samples.t_raw, real[:, 0])
    np.testing.assert_allclose(samples.values[:, 0], real[:, 1] / 1000)


@pytest.mark.fast
def test_fewer_streams_are_recorded_and_cost_fewer_wake_ups() -> None:
    full, _, full_clock = setup()
    lean, _, lean_clock = setup(streams="samples,energy")
    assert [d.source_id for d in lean.open()] == ["gpu0.samples", "gpu0.energy"]
    assert lean.descriptors[0].config["streams"] == ["samples", "energy"]
    full.open()
    lean_out = run_for(lean, lean_clock, 18.0)
    run_for(full, full_clock, 18.0)
    lean.close()
    full.close()
    assert set(by_source(lean_out)) == {"gpu0.samples", "gpu0.energy"}
    samples = by_source(lean_out)["gpu0.samples"]
    assert np.all(np.diff(samples.t_raw) > 0) and 18 * 49 < samples.t_raw.size <= 18 * 50 + 1
    assert not [r for r in lean_out if isinstance(r, Gap)]
    assert len(lean_clock.sleeps) <= 21  # one wake-up per 0.9 s drain
    assert len(full_clock.sleeps) >= 190  # one per 90 ms power poll
    energy = by_source(lean_out)["gpu0.energy"].values[:, 0]
    assert energy[-1] - energy[0] == pytest.approx(
        float(np.trapezoid(samples.values[:, 0], samples.t_raw / 1e6)), rel=0.02)


@pytest.mark.fast
@pytest.mark.parametrize(("text", "problem"), [
    ("samples,bogus", "no stream named 'bogus'"),
    ("", "none given"),
    (" , ", "none given"),
    ("all,samples", "no stream named 'all'"),
])
def test_bad_stream_lists_are_named(text: str, problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        setup(streams=text)


@pytest.mark.fast
def test_streams_are_kept_in_their_canonical_order() -> None:
    assert parse_streams("energy, SAMPLES") == ("samples", "energy")
    assert parse_streams(["state"]) == ("state",)
    assert parse_streams("all") == ("samples", "power", "energy", "state", "processes")


@pytest.mark.fast
def test_a_gpu_without_any_stream_asked_for_is_refused() -> None:
    acq, _, _ = setup(unsupported=frozenset({"nvmlDeviceGetSamples"}), streams="samples")
    with pytest.raises(NvmlError, match="supports none of the NVML streams asked for"):
        acq.open()
    assert acq.poll() == []


@pytest.mark.fast
def test_wake_ends_the_readers_long_sleep_at_once() -> None:
    gpu = SimulatedGpu(index=0, seed=3, schedule=WorkloadSchedule.demo(3, 20.0))
    acq = NvmlAcquirer(NvmlDriver(FakeNvml([gpu])), 0, streams="samples",
                       intervals_s={"drain": 30.0, "emit": 30.0})
    acq.open()
    try:
        poller = threading.Thread(target=acq.poll)
        poller.start()
        time.sleep(0.2)
        assert poller.is_alive()  # asleep until the drain, 30 s away
        woken = time.monotonic()
        acq.wake()
        poller.join(5.0)
        assert not poller.is_alive() and time.monotonic() - woken < 1.0
    finally:
        acq.close()


@pytest.mark.fast
def test_rarer_reads_wake_once_per_cadence_and_lose_no_sample() -> None:
    """drain=emit=1.8 s: the reader sleeps 1.8 s at a time (no shorter cap), every sample kept."""
    acq, _, clock = setup(streams="samples,energy",
                          intervals_s=parse_intervals("drain=1.8,emit=1.8,energy=60"))
    acq.open()
    readings = run_for(acq, clock, 18.0)
    acq.close()
    assert clock.sleeps[1:] == pytest.approx([1.8] * (len(clock.sleeps) - 1))
    assert len(clock.sleeps) == 10
    samples = by_source(readings)["gpu0.samples"]
    assert not [r for r in readings if isinstance(r, Gap)]
    gaps_us = np.diff(samples.t_raw)
    assert gaps_us.min() > 0 and gaps_us.max() < 30_000  # each sample once, none missing
    assert abs(len(samples.t_raw) - 900) <= 2  # 18 s of 20 ms samples
    assert len(by_source(readings)["gpu0.energy"].t_host_ns) == 2  # at the start and at the end


@pytest.mark.fast
def test_parse_intervals_accepts_text_and_tables() -> None:
    assert parse_intervals("") == {}
    assert parse_intervals(" Drain = 1.8 , emit=6,") == {"drain": 1.8, "emit": 6.0}
    assert parse_intervals({"energy": 60, "power": 0.02}) == {"energy": 60.0, "power": 0.02}


@pytest.mark.fast
@pytest.mark.parametrize(("value", "named"), [
    ("drain=2.01", "drain=2.01 s is longer than 2.0 s"), ("power=0.001", "power=0.001 must be"),
    ("emit=-1", "emit=-1 must be"), ("state=inf", "state=inf must be"),
    ("flush=1", "no cadence named 'flush'"), ("drain:1", "'drain:1' is not KEY=SECONDS"),
    ({"emit": True}, "emit=True must be"), ({"emit": "x"}, "emit=x must be")])
def test_parse_intervals_refuses_bad_values_by_name(value: Any, named: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_intervals(value)
    assert named in str(e.value)


@pytest.mark.fast
def test_the_acquirer_refuses_an_unknown_cadence() -> None:
    with pytest.raises(ValueError, match="no NVML cadence named 'poll'"):
        setup(intervals_s={"poll": 1.0})


@pytest.mark.fast
def test_drained_samples_wait_for_the_emit() -> None:
    """drain 0.3 s, emit 1.5 s: samples leave once per emit (fewer run-file writes), all kept."""
    acq, _, _ = setup(streams="samples", intervals_s={"drain": 0.3, "emit": 1.5})
    acq.open()
    polls = [acq.poll() for _ in range(25)]  # 25 wake-ups of 0.3 s: 7.5 s
    tail = acq.flush()
    acq.close()
    with_samples = [i for i, p in enumerate(polls) if p]
    assert with_samples == [4, 9, 14, 19, 24]  # every fifth wake-up, at each emit
    assert all(len(polls[i]) == 5 for i in with_samples)  # the five drains since the last
    samples = by_source([r for p in polls for r in p] + tail)["gpu0.samples"]
    gaps_us = np.diff(samples.t_raw)
    assert gaps_us.min() > 0 and gaps_us.max() < 30_000
    assert abs(len(samples.t_raw) - 375) <= 3  # 7.5 s of 20 ms samples
