"""Physics and NVML artefacts of the simulated GPU, checked against its exact true power."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from wattlab.device_models.workload_schedule import Segment, WorkloadSchedule
from wattlab.errors import UsageError
from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu, simulated_gpus

pytestmark = pytest.mark.fast

S = 1_000_000_000
UNIX0 = 1_700_000_000 * S


class FakeClock:
    def __init__(self, t_ns: int = 5 * S) -> None:
        self.t_ns = t_ns

    def __call__(self) -> int:
        return self.t_ns

    def sleep(self, dt_s: float) -> None:
        self.t_ns += round(dt_s * 1e9)


def make_gpu(schedule: WorkloadSchedule, seed: int = 1, **kwargs: Any) -> SimulatedGpu:
    clock = FakeClock(0)
    return SimulatedGpu(
        seed=seed, schedule=schedule, clock_ns=clock, start_ns=0, unix_offset_ns=UNIX0, **kwargs
    )


# ---------------------------------------------------------------- schedule


def test_schedule_rejects_bad_segments() -> None:
    with pytest.raises(UsageError, match="utilisation"):
        WorkloadSchedule([(1.0, 1.5)])
    with pytest.raises(UsageError, match="duration"):
        WorkloadSchedule([(0.0, 0.5)])
    with pytest.raises(UsageError, match="at least one"):
        WorkloadSchedule([])


def test_schedule_integral_is_exact_and_idles_after_end() -> None:
    sched = WorkloadSchedule([(1.0, 0.0, "idle"), (2.0, 1.0, "full"), (1.0, 0.5, "half")])
    assert sched.duration_s == 4.0
    np.testing.assert_allclose(
        sched.integral([0.5, 1.5, 3.0, 3.5, 4.0, 9.0]), [0.0, 0.5, 2.0, 2.25, 2.5, 2.5]
    )
    np.testing.assert_allclose(sched.utilisation_at([-1, 0.2, 1.0, 3.2, 4.5]), [0, 0, 1, 0.5, 0])
    assert sched.segment_name_at(1.5) == "full"
    assert sched.segment_name_at(5.0) == ""


def test_schedule_repeat_wraps() -> None:
    sched = WorkloadSchedule([(1.0, 1.0), (1.0, 0.0)], repeat=True)
    np.testing.assert_allclose(sched.integral([2.5, 5.0]), [1.5, 3.0])
    assert sched.utilisation_at(4.5) == 1.0


def test_demo_and_random_schedules_are_deterministic_and_varied() -> None:
    a, b = WorkloadSchedule.demo(7), WorkloadSchedule.demo(7)
    assert a.segments == b.segments
    assert a.segments != WorkloadSchedule.demo(8).segments
    assert math.isclose(a.duration_s, 20.0)
    names = {s.name for s in a.segments}
    assert {"idle", "half", "full", "burst"} <= names
    assert {s.utilisation for s in a.segments} == {0.0, 0.5, 1.0}
    r = WorkloadSchedule.random(3, 30.0)
    assert r.segments == WorkloadSchedule.random(3, 30.0).segments
    assert math.isclose(r.duration_s, 30.0)
    assert all(isinstance(s, Segment) and s.duration_s <= 3.0 for s in r.segments)


# ---------------------------------------------------------------- determinism


def test_same_seed_same_gpu_different_seed_different() -> None:
    sched = WorkloadSchedule.demo(1, 5.0)
    g1, g2, g3 = make_gpu(sched, seed=4), make_gpu(sched, seed=4), make_gpu(sched, seed=5)
    t = np.arange(0, 5 * S, 3_000_000)
    np.testing.assert_array_equal(g1.true_power_w_array(t), g2.true_power_w_array(t))
    assert not np.array_equal(g1.true_power_w_array(t), g3.true_power_w_array(t))
    assert (g1.uuid, g1.serial) == (g2.uuid, g2.serial)
    assert g1.uuid != g3.uuid and g1.uuid.startswith("GPU-")
    np.testing.assert_array_equal(g1.power_samples(4 * S)[1], g2.power_samples(4 * S)[1])


def test_query_order_does_not_change_the_waveform() -> None:
    sched = WorkloadSchedule.demo(2, 5.0)
    g1, g2 = make_gpu(sched), make_gpu(sched)
    late = g2.true_energy_j(3 * S, 4 * S)  # g2 computes out of order
    assert g1.true_energy_j(0, 2 * S) == g2.true_energy_j(0, 2 * S)
    assert g1.true_energy_j(3 * S, 4 * S) == late


def test_simulated_gpus_have_distinct_identities() -> None:
    gpus = simulated_gpus(2, seed=3, clock_ns=FakeClock(0), start_ns=0)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].uuid != gpus[1].uuid


# ---------------------------------------------------------------- physics


def test_idle_power_and_top_clock() -> None:
    g = make_gpu(WorkloadSchedule.constant(0.0, 10.0))
    assert abs(g.mean_power_w(S, 3 * S) - 70.0) < 1.0
    assert g.sm_clock_mhz(2 * S) == 1980


def test_power_cap_lowers_clock_and_holds_power_at_limit() -> None:
    full = WorkloadSchedule.constant(1.0, 20.0)
    g = make_gpu(full)
    assert abs(g.mean_power_w(S, 5 * S) - 700.0) < 10.0
    capped_clock = g.sm_clock_mhz(2 * S)
    assert 345 < capped_clock < 1980
    assert capped_clock in g.model.sm_clocks_mhz
    half = make_gpu(WorkloadSchedule.constant(0.5, 10.0))
    assert half.sm_clock_mhz(2 * S) == 1980  # 570 W demand fits under 700 W
    assert abs(half.mean_power_w(S, 5 * S) - 570.0) < 10.0


def test_lower_limit_from_now_on_leaves_the_past_alone() -> None:
    g = make_gpu(WorkloadSchedule.constant(1.0, 20.0))
    clock = g.clock_ns
    assert isinstance(clock, FakeClock)
    clock.t_ns = 5 * S
    g.set_power_limit_w(300.0)
    assert g.power_limit_w == 300.0
    assert abs(g.mean_power_w(S, 4 * S) - 700.0) < 10.0
    assert abs(g.mean_power_w(6 * S, 9 * S) - 300.0) < 5.0
    assert g.sm_clock_mhz(7 * S) < g.sm_clock_mhz(3 * S)
    # a slower clock does less work per second
    assert g.work_done(6 * S, 7 * S) < g.work_done(2 * S, 3 * S)
    with pytest.raises(UsageError, match="outside"):
        g.set_power_limit_w(100.0)


def test_power_limit_change_keeps_the_computed_past_bit_exact() -> None:
    g = make_gpu(WorkloadSchedule.constant(1.0, 20.0))
    e_past = g.true_energy_j(0, 5 * S)
    assert isinstance(g.clock_ns, FakeClock)
    g.clock_ns.t_ns = 5 * S
    g.set_power_limit_w(250.0)
    assert g.true_energy_j(0, 5 * S) == e_past


def test_locked_clock_limits_frequency_power_and_work() -> None:
    g = make_gpu(WorkloadSchedule.constant(0.5, 20.0))
    assert isinstance(g.clock_ns, FakeClock)
    g.clock_ns.t_ns = 2 * S
    g.set_locked_clocks_mhz(1200, 1200)
    assert g.sm_clock_mhz(3 * S) == 1200
    assert g.mean_power_w(3 * S, 4 * S) < g.mean_power_w(0, S) - 100
    assert g.work_done(3 * S, 4 * S) == pytest.approx(0.5 * 1200 / 1980, rel=1e-9)
    assert g.work_done(0, S) == pytest.approx(0.5, rel=1e-9)
    g.clock_ns.t_ns = 5 * S
    g.reset_locked_clocks()
    assert g.locked_clocks_mhz is None
    assert g.sm_clock_mhz(6 * S) == 1980


def test_energy_is_the_exact_integral_of_power() -> None:
    g = make_gpu(WorkloadSchedule.demo(3, 6.0))
    t = np.arange(0, 6 * S, 1_000_000)  # every 1 ms bin
    riemann = g.true_power_w_array(t).sum() * 1e-3
    assert g.true_energy_j(0, 6 * S) == pytest.approx(riemann, rel=1e-12)
    # sub-millisecond bounds are exact too (power is constant inside a bin)
    p = g.true_power_w(2 * S + 100)
    assert g.true_energy_j(2 * S + 100_000, 2 * S + 600_000) == pytest.approx(p * 5e-4, rel=1e-9)


def test_temperature_rises_slowly_under_load() -> None:
    g = make_gpu(WorkloadSchedule([(2.0, 0.0), (60.0, 1.0)]))
    t_idle = g.temperature_c(2 * S)
    t_10 = g.temperature_c(12 * S)
    t_60 = g.temperature_c(60 * S)
    assert t_idle < t_10 < t_60 < 30 + 0.07 * 720
    # first order, tau 20 s: ~40 % of the 60 s rise after 10 s
    assert 0.3 < (t_10 - t_idle) / (t_60 - t_idle) < 0.5


# ---------------------------------------------------------------- NVML views


def test_sample_buffer_every_20ms_capacity_120_unix_us() -> None:
    g = make_gpu(WorkloadSchedule.demo(1, 20.0))
    stamps, mw = g.power_samples(10 * S)
    assert stamps.shape == mw.shape == (120,)
    dt_ms = np.diff(stamps) / 1000
    assert dt_ms.min() >= 14 and dt_ms.max() <= 26 and abs(dt_ms.mean() - 20) < 0.5
    assert UNIX0 // 1000 + 7 * 10**6 < stamps[0] < stamps[-1] <= UNIX0 // 1000 + 10 * 10**6
    # each value is the mean over the 20 ms window ending 15 ms before its stamp
    t_ns = int(stamps[50]) * 1000 - UNIX0
    expected = g.mean_power_w(t_ns - 35_000_000, t_ns - 15_000_000)
    assert abs(mw[50] - expected * 1000) < 50  # the stamp is rounded to 1 µs


def test_sample_buffer_mean_matches_true_mean() -> None:
    g = make_gpu(WorkloadSchedule.random(5, 20.0))
    stamps: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for t in range(2, 21, 2):
        s, v = g.power_samples(t * S)
        keep = s > (stamps[-1][-1] if stamps else 0)
        stamps.append(s[keep])
        values.append(v[keep])
    mw = np.concatenate(values)
    t0 = int(np.concatenate(stamps)[0]) * 1000 - UNIX0 - 35_000_000
    t1 = int(np.concatenate(stamps)[-1]) * 1000 - UNIX0 - 15_000_000
    assert np.all(np.diff(np.concatenate(stamps)) > 0)
    assert mw.mean() / 1000 == pytest.approx(g.mean_power_w(t0, t1), rel=0.01)


def test_energy_counter_equals_integral_at_updates() -> None:
    g = make_gpu(WorkloadSchedule.demo(2, 10.0))
    assert g.energy_mj(0) == g.energy_offset_mj
    for t in (S // 2, 3 * S + 17, 7 * S + 999_999):
        u = g.last_update_ns(t)
        assert u is not None and t - 100_000_000 < u <= t
        assert g.energy_mj(t) - g.energy_offset_mj == math.floor(g.true_energy_j(0, u) * 1000)
    # it holds between 100 ms ticks
    u = g.last_update_ns(5 * S)
    assert u is not None
    assert g.energy_mj(u) == g.energy_mj(u + 99_000_000) != g.energy_mj(u + 100_000_000)


def test_instant_is_part_time_and_updates_every_100ms() -> None:
    g = make_gpu(WorkloadSchedule.random(9, 10.0))
    t = np.arange(2 * S, 4 * S, 5_000_000)
    values = np.array([g.instant_power_mw(int(x)) for x in t])
    change_t = t[1:][np.diff(values) != 0]
    gaps_ms = np.diff(change_t) / 1e6
    assert np.all(np.round(gaps_ms / 100) * 100 == pytest.approx(gaps_ms, abs=5.0))
    assert len(change_t) >= 15
    u = g.last_update_ns(3 * S)
    assert u is not None
    assert g.instant_power_mw(3 * S) == round(g.mean_power_w(u - 25_000_000, u) * 1000)


def test_average_is_a_1s_boxcar_lagging_half_a_second() -> None:
    g = make_gpu(WorkloadSchedule([(5.0, 0.0), (5.0, 1.0)]))
    u = g.last_update_ns(8 * S)
    assert u is not None
    assert g.average_power_mw(8 * S) == round(g.mean_power_w(u - S, u) * 1000)
    t = np.arange(4 * S, 8 * S, 5_000_000)
    avg = np.array([g.average_power_mw(int(x)) for x in t]) / 1000
    mid = (70 + 700) / 2
    crossing_s = t[np.argmax(avg > mid)] / S
    assert 5.45 <= crossing_s <= 5.65  # 0.5 s boxcar delay + up to 0.1 s update wait
    inst = np.array([g.instant_power_mw(int(x)) for x in t]) / 1000
    inst_cross_s = t[np.argmax(inst > mid)] / S
    assert 5.0 < inst_cross_s <= 5.13


def test_utilisation_percent_follows_the_schedule() -> None:
    g = make_gpu(WorkloadSchedule([(2.0, 0.0), (2.0, 0.5)]))
    assert g.utilisation_pct(S) == (0, 0)
    assert g.utilisation_pct(3 * S) == (50, 30)
    assert g.utilisation(3 * S) == 0.5


def test_model_parameters_are_respected() -> None:
    model = GpuModel(
        idle_w=40.0,
        dynamic_w=300.0,
        power_limit_range_w=(100.0, 300.0),
        default_power_limit_w=250.0,
        sm_clocks_mhz=(1000, 900, 800),
    )
    g = make_gpu(WorkloadSchedule.constant(1.0, 5.0), model=model)
    assert g.power_limit_w == 250.0
    assert g.sm_clock_mhz(S) == 900
    assert abs(g.mean_power_w(S, 3 * S) - 250.0) < 5.0


def test_cap_below_reach_of_lowest_clock_runs_at_lowest_clock() -> None:
    model = GpuModel(sm_clocks_mhz=(1000, 900, 800))
    g = make_gpu(WorkloadSchedule.constant(1.0, 5.0), model=model)
    g.set_power_limit_w(200.0)
    assert g.sm_clock_mhz(S) == 800
    assert g.mean_power_w(S, 2 * S) > 200.0  # the hardware cannot go lower


# ---------------------------------------------------------------- bounded history


def test_short_history_gives_the_same_waveform_with_flat_memory() -> None:
    sched = WorkloadSchedule.demo(4, 120.0)
    full, short = make_gpu(sched), make_gpu(sched, history_s=5.0)
    sizes = []
    for second in range(1, 121):  # two minutes, asked for as a reader would: near "now"
        t = second * S
        assert short.energy_mj(t) == full.energy_mj(t)
        assert short.temperature_c(t - S // 3) == full.temperature_c(t - S // 3)
        np.testing.assert_array_equal(short.power_samples(t)[1], full.power_samples(t)[1])
        assert short.sm_clock_mhz(t + S // 2) == full.sm_clock_mhz(t + S // 2)
        grid = short._waveform
        sizes.append(grid._cum_e.nbytes + grid._clk.nbytes + 8 * len(grid._temps_c))
    assert max(sizes[60:]) <= max(sizes[:60])  # no growth in the second minute
    assert sizes[-1] < 0.2 * (full._waveform._cum_e.nbytes + full._waveform._clk.nbytes)


def test_asking_for_a_time_older_than_the_history_says_so() -> None:
    g = make_gpu(WorkloadSchedule.demo(4, 30.0), history_s=5.0)
    g.true_energy_j(59 * S, 60 * S)
    with pytest.raises(UsageError, match="keeps the last 5 s"):
        g.true_energy_j(10 * S, 60 * S)
    with pytest.raises(UsageError, match="keeps the last 5 s"):
        g.temperature_c(10 * S)


def test_held_history_keeps_a_long_run_exact() -> None:
    sched = WorkloadSchedule.demo(4, 30.0)
    full, short = make_gpu(sched), make_gpu(sched, history_s=5.0)
    short.true_energy_j(9 * S, 10 * S)
    short.hold_history_from(10 * S + 123)
    for second in range(11, 80):
        short.true_power_w(second * S)
    assert short.true_energy_j(10 * S + 123, 79 * S) == full.true_energy_j(10 * S + 123, 79 * S)
    assert short.work_done(10 * S + 123, 79 * S) == full.work_done(10 * S + 123, 79 * S)
    short.hold_history_from(None)
    for second in range(80, 400):  # past what the grown arrays hold: the old part goes
        short.true_power_w(second * S)
    with pytest.raises(UsageError):
        short.true_energy_j(10 * S + 123, 399 * S)


# ---------------------------------------------------------------- a job that slows down


def _busy_starts(gpu: SimulatedGpu, until_s: float, from_s: float = 0.0) -> int:
    """How many busy steps begin in [from, until): rising edges of the utilisation."""
    t = np.arange(round(from_s * 1e3), round(until_s * 1e3)) * 1_000_000
    busy = np.array([False] + [gpu.utilisation(int(x)) > 0.5 for x in t])
    return int(np.count_nonzero(busy[1:] & ~busy[:-1]))


def _training() -> WorkloadSchedule:
    return WorkloadSchedule([Segment(0.15, 1.0, "step"), Segment(0.05, 0.05, "load")],
                            repeat=True)


def test_a_lower_clock_stretches_the_steps_as_a_real_job() -> None:
    """Issue 38: the busy part of a step takes longer at a lower clock (the data loading
    does not), so fewer steps fit in the same time; at the default nothing moves."""
    free, slow = make_gpu(_training()), make_gpu(_training())
    slow.set_locked_clocks_mhz(990, 990)
    assert _busy_starts(free, 10.0) == 50  # the schedule's own 200 ms steps
    f_cap = free.sm_clock_mhz(100 * 1_000_000)  # the 700 W cap's clock while busy
    step_s = 0.15 * f_cap / 990 + 0.05
    assert _busy_starts(slow, 10.0) == pytest.approx(10.0 / step_s, abs=1)
    # the work per step is the same: what a step needs does not depend on the clock
    assert slow.work_done(0, 10 * S) == pytest.approx(free.work_done(0, 10 * S) * 0.2 / step_s,
                                                      rel=0.02)


def test_a_gpu_following_a_surface_takes_its_time_and_energy_per_iteration() -> None:
    """Two clocks: at the low one an iteration takes twice as long for 80 % of the energy."""
    from wattlab.device_models import SettingResponse

    response = SettingResponse("toy", {"sm_clock": (1000.0, 2000.0)}, np.array([2.0, 1.0]),
                               np.array([0.8, 1.0]), 300.0)
    model = GpuModel.following(response)
    assert model.sm_clocks_mhz == (2000, 1000) and model.idle_w + model.dynamic_w == 300.0
    free, slow = make_gpu(_training(), model=model), make_gpu(_training(), model=model)
    slow.set_locked_clocks_mhz(1000, 1000)
    assert _busy_starts(slow, 8.0) == 20 and _busy_starts(free, 4.0) == 20  # 0.4 s vs 0.2 s
    ratio = slow.true_energy_j(0, 8 * S) / free.true_energy_j(0, 4 * S)
    assert ratio == pytest.approx(0.8, rel=0.01)
    assert slow.sm_clock_mhz(S) == 1000 and free.sm_clock_mhz(S) == 2000
    assert response.ratios({"sm_clock": 1500.0}) == (1.5, 0.9)
