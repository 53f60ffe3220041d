"""A simulated GPU whose power, clocks and NVML views behave like a real H100's.

Why: the NVML reader, the calibration and the sweep must run (and be tested) on machines
without a GPU, against a device whose *true* power is known exactly. The simulator keeps the
true power piecewise-constant on a 1 ms grid (cumulative sums make every energy integral
exact) and derives each NVML view from it with the artefacts measured on a real H100
(PROTOCOLS.md §7): a 50 Hz sample buffer, a "part-time" instant reading, a 1 s boxcar
average and an energy counter that tick every 100 ms. The grid itself, with the settings it
is computed under, is gpu_waveform.py's.

Everything is deterministic for a given seed; times are in the units of ``clock_ns``
(``time.monotonic_ns`` by default) with the origin at construction (or ``start_ns``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from wattlab.device_models import SettingResponse, WorkloadSchedule
from wattlab.errors import UsageError
from wattlab.hardware.gpu_waveform import Waveform

if TYPE_CHECKING:
    from wattlab.hardware.shared_gpu import SharedLoad

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

HISTORY_S = 120.0  # how much of the past the grid keeps (an hours-long session stays flat)


# --------------------------------------------------------------------------- schedule

# --------------------------------------------------------------------------- model


def _h100_sm_clocks() -> tuple[int, ...]:
    return tuple(range(1980, 344, -15))  # 110 clocks, highest first, as NVML lists them


@dataclass(frozen=True)
class GpuModel:
    """Physics and driver-artefact parameters; defaults resemble an H100 SXM (PROTOCOLS §7)."""

    name: str = "Simulated H100 80GB HBM3"
    idle_w: float = 70.0
    dynamic_w: float = 1000.0  # extra power at utilisation 1 and the top clock (before capping)
    clock_exponent: float = 2.7  # P_dyn ∝ f^k: frequency times voltage squared
    power_limit_range_w: tuple[float, float] = (200.0, 700.0)
    default_power_limit_w: float = 700.0
    sm_clocks_mhz: tuple[int, ...] = field(default_factory=_h100_sm_clocks)
    mem_clocks_mhz: tuple[int, ...] = (2619, 1593)  # the highest is the default
    # Memory clock physics (inert at the default, top memory clock): this share of the work
    # is memory-bound and takes f_mem_max / f_mem times as long at a lower memory clock, and
    # this much of the idle / full-load power is memory power, proportional to f_mem.
    mem_bound_frac: float = 0.3
    mem_idle_w: float = 15.0
    mem_dynamic_w: float = 120.0
    ripple_frac: float = 0.08  # std of the fast power ripple, as a fraction of dynamic power
    ripple_floor_w: float = 1.5
    ripple_corr_ms: float = 10.0
    sample_period_s: float = 0.020
    sample_window_s: float = 0.020
    sample_delay_s: float = 0.015  # window ends this long before the stamp: ~25 ms lag as on H100
    sample_jitter_s: float = 0.003
    sample_buffer_len: int = 120  # a real H100 (driver 580) returned 119 samples, ~2.4 s
    update_period_s: float = 0.100
    instant_window_s: float = 0.025  # "part-time": only 25 ms of each 100 ms period
    average_window_s: float = 1.0
    ambient_c: float = 30.0
    thermal_resistance_c_per_w: float = 0.07
    thermal_tau_s: float = 20.0
    # a published surface the workload follows instead of the physics above (None: physics)
    response: SettingResponse | None = None

    @classmethod
    def following(cls, response: SettingResponse) -> GpuModel:
        """A GPU whose job takes the time and energy per iteration ``response`` says.

        Its knobs are the surface's own values (the H100's where it has no such axis) and
        its busy power at the default is the surface's mean power (30 % of it idle).
        """
        axes, top = response.axes, cls()
        power = axes.get("power_limit")
        return cls(
            name=f"Simulated GPU following {response.name}",
            idle_w=0.3 * response.power_w, dynamic_w=0.7 * response.power_w,
            power_limit_range_w=(power[0], power[-1]) if power else top.power_limit_range_w,
            default_power_limit_w=power[-1] if power else top.default_power_limit_w,
            sm_clocks_mhz=tuple(round(v) for v in reversed(axes["sm_clock"]))
            if "sm_clock" in axes else top.sm_clocks_mhz,
            mem_clocks_mhz=tuple(round(v) for v in reversed(axes["mem_clock"]))
            if "mem_clock" in axes else top.mem_clocks_mhz,
            response=response)


def _splitmix_uniform(key: int, k: IntArray) -> FloatArray:
    """Deterministic uniform [0, 1) per integer k: a stateless hash (splitmix64)."""
    base = np.full(k.shape, key & 0xFFFFFFFF, dtype=np.uint64)  # arrays wrap without warnings
    z = k.astype(np.uint64) + base * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class SimulatedGpu:
    """One simulated GPU: a true power waveform plus the views NVML gives of it.

    ``unsupported`` names NVML calls/fields this GPU lacks (e.g. ``"NVML_FI_DEV_POWER_INSTANT"``,
    ``"nvmlDeviceGetSerial"``); the fake NVML answers NOT_SUPPORTED for them. ``settable=False``
    makes the setters answer NO_PERMISSION, as on a machine without root. ``mig``,
    ``virtualization_mode`` (an ``NVML_GPU_VIRTUALIZATION_MODE_*``) and ``module_power`` (a
    GH200-style module whose readings cover CPU, GPU and memory) shape what capability
    detection finds.
    """

    def __init__(
        self,
        index: int = 0,
        seed: int = 0,
        schedule: WorkloadSchedule | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        *,
        start_ns: int | None = None,
        unix_offset_ns: int | None = None,
        model: GpuModel | None = None,
        unsupported: Collection[str] = (),
        settable: bool = True,
        history_s: float = HISTORY_S,
        mig: bool = False,
        virtualization_mode: int = 0,
        module_power: bool = False,
    ) -> None:
        self.index = index
        self.mig = mig
        self.virtualization_mode = virtualization_mode
        self.module_power = module_power
        self.seed = seed
        self.model = model or GpuModel()
        self.schedule = schedule or WorkloadSchedule.demo(seed)
        self.clock_ns = clock_ns
        self.start_ns = clock_ns() if start_ns is None else start_ns
        # unix time = clock time + offset; the sample buffer stamps in unix µs
        self.unix_offset_ns = (
            time.time_ns() - clock_ns() if unix_offset_ns is None else unix_offset_ns
        )
        self.unsupported = frozenset(unsupported)
        self.settable = settable
        self.processes: SharedLoad | None = None  # processes sharing it (shared_gpu.py)
        m = self.model
        rng = np.random.default_rng([seed, index, 0x1D])
        self.uuid = "GPU-{}-{}-{}-{}-{}".format(*(rng.bytes(n).hex() for n in (4, 2, 2, 2, 6)))
        self.serial = str(int(rng.integers(10**12, 10**13)))
        self.board_part_number = f"692-2G520-{int(rng.integers(10**4)):04d}-000"
        self.energy_offset_mj = int(rng.integers(10**6, 10**8))  # "since driver load"
        self._sample_offset_ns = int(
            (
                m.sample_delay_s
                + m.sample_window_s
                + m.sample_jitter_s
                + rng.uniform(0, m.sample_period_s)
            )
            * 1e9
        )
        self._update_offset_ns = int((m.instant_window_s + rng.uniform(0, m.update_period_s)) * 1e9)
        self._waveform = Waveform(m, self.schedule, index=index, seed=seed, clock_ns=clock_ns,
                                  start_ns=self.start_ns, history_s=history_s)

    # ------------------------------------------------------------------ settings

    @property
    def power_limit_w(self) -> float:
        """The power cap in force now (W)."""
        return self._waveform.settings.power_limit_w

    @property
    def locked_clocks_mhz(self) -> tuple[float, float] | None:
        """(min, max) SM clock lock in force now, or None when the clock is free."""
        return self._waveform.settings.locked_mhz

    def set_power_limit_w(self, limit_w: float) -> None:
        """Change the power cap from now on (the past keeps its waveform)."""
        lo, hi = self.model.power_limit_range_w
        if not lo <= limit_w <= hi:
            raise UsageError(
                f"simulated GPU {self.index}: power limit {limit_w} W is outside {lo:g}-{hi:g} W"
            )
        self._waveform.change(lambda s: replace(s, power_limit_w=float(limit_w)))

    def set_locked_clocks_mhz(self, min_mhz: float, max_mhz: float) -> None:
        """Lock the SM clock into [min, max] from now on; the power cap still wins."""
        if min_mhz > max_mhz:
            raise UsageError(f"simulated GPU {self.index}: locked clocks {min_mhz} > {max_mhz}")
        self._waveform.change(lambda s: replace(s, locked_mhz=(float(min_mhz), float(max_mhz))))

    def reset_locked_clocks(self) -> None:
        """Free the SM clock from now on."""
        self._waveform.change(lambda s: replace(s, locked_mhz=None))

    @property
    def mem_clock_mhz(self) -> int:
        """Memory clock in force now (MHz): the top one unless a lock says otherwise."""
        return round(self._waveform.mem_clock_now())

    @property
    def locked_mem_clocks_mhz(self) -> tuple[float, float] | None:
        """(min, max) memory clock lock in force now, or None when the clock is free."""
        return self._waveform.settings.mem_locked_mhz

    def set_locked_mem_clocks_mhz(self, min_mhz: float, max_mhz: float) -> None:
        """Lock the memory clock into [min, max] from now on."""
        if min_mhz > max_mhz:
            raise UsageError(
                f"simulated GPU {self.index}: locked memory clocks {min_mhz} > {max_mhz}"
            )
        self._waveform.change(
            lambda s: replace(s, mem_locked_mhz=(float(min_mhz), float(max_mhz))))

    def reset_locked_mem_clocks(self) -> None:
        """Free the memory clock (back to the top one) from now on."""
        self._waveform.change(lambda s: replace(s, mem_locked_mhz=None))

    def hold_history_from(self, t_ns: int | None) -> None:
        """Keep the waveform from ``t_ns`` on, however old it gets (None: release).

        A sweep run asks for its true energy and work since the run began, which may be
        longer ago than the history the grid keeps.
        """
        self._waveform.hold_from(t_ns)

    # ------------------------------------------------------------------ true quantities

    def true_power_w_array(self, t_ns: npt.ArrayLike) -> FloatArray:
        """True power at each time: the value of its 1 ms bin."""
        return self._waveform.power_w_at(t_ns)

    def true_power_w(self, t_ns: int) -> float:
        """True power at one time (W)."""
        return float(self.true_power_w_array(np.array([t_ns]))[0])

    def true_energy_j(self, t0_ns: int, t1_ns: int) -> float:
        """Exact energy between two times (J)."""
        e = self._waveform.energy_j_at(np.array([t0_ns, t1_ns]))
        return float(e[1] - e[0])

    def energy_since_start_j(self, t_ns: int) -> float:
        """Exact energy from the start to ``t_ns`` (J): what a running counter has added."""
        return float(self._waveform.energy_j_at(np.array([t_ns]))[0])

    def mean_power_w(self, t0_ns: int, t1_ns: int) -> float:
        """Exact mean true power over [t0, t1] (W)."""
        if t1_ns <= t0_ns:
            raise UsageError(f"mean power needs t1 > t0, got {t0_ns}..{t1_ns}")
        return self.true_energy_j(t0_ns, t1_ns) / ((t1_ns - t0_ns) * 1e-9)

    def work_done(self, t0_ns: int, t1_ns: int) -> float:
        """Work done between two times, in seconds of full-clock busy GPU (clock times util)."""
        w = self._waveform.work_at(np.array([t0_ns, t1_ns]))
        return float(w[1] - w[0])

    def sm_clock_mhz_array(self, t_ns: npt.ArrayLike) -> FloatArray:
        """SM clock (MHz, a supported clock) at each time."""
        return self._waveform.sm_clock_mhz_at(t_ns)

    def sm_clock_mhz(self, t_ns: int) -> int:
        """SM clock (MHz) at one time."""
        return int(self.sm_clock_mhz_array(np.array([t_ns]))[0])

    def utilisation(self, t_ns: int) -> float:
        """Utilisation (0..1) at one time: its 1 ms bin's (the schedule at the GPU's pace)."""
        b = self._waveform.busy_at(np.array([t_ns, t_ns + 1_000_000]))
        return round(float(b[1] - b[0]) * 1e3, 12)  # exact levels stay exact

    def temperature_c(self, t_ns: int) -> float:
        """GPU temperature: a first-order lag (tau ~20 s) behind the power, stepped per second."""
        return self._waveform.temperature_c(t_ns)

    # ------------------------------------------------------------------ NVML views

    def supports(self, nvml_name: str) -> bool:
        """Whether this GPU answers the named NVML call or field."""
        return nvml_name not in self.unsupported

    def to_unix_us(self, t_ns: npt.ArrayLike) -> IntArray:
        """Clock times to the driver's unix-µs timestamps."""
        return (np.asarray(t_ns, dtype=np.int64) + self.unix_offset_ns) // 1000

    def _sample_times_ns(self, k: IntArray) -> IntArray:
        m = self.model
        jitter = (_splitmix_uniform(self.seed * 131 + self.index, k) * 2 - 1) * m.sample_jitter_s
        nominal = self.start_ns + self._sample_offset_ns + k * round(m.sample_period_s * 1e9)
        return np.asarray(nominal + np.round(jitter * 1e9).astype(np.int64), dtype=np.int64)

    def power_samples(self, now_ns: int) -> tuple[IntArray, IntArray]:
        """The 50 Hz buffer as held at ``now``: (unix µs stamps, mW), oldest first.

        Each value is the mean true power over ``sample_window_s`` ending ``sample_delay_s``
        before its stamp; the ring holds ``sample_buffer_len`` samples, older ones fall off.
        """
        m = self.model
        period_ns = round(m.sample_period_s * 1e9)
        k_guess = (now_ns - self.start_ns - self._sample_offset_ns) // period_ns
        ks = np.arange(max(0, k_guess - m.sample_buffer_len - 1), max(0, k_guess + 2))
        t = self._sample_times_ns(ks)
        t = t[t <= now_ns][-m.sample_buffer_len :]
        if t.shape[0] == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        end = t - round(m.sample_delay_s * 1e9)
        begin = end - round(m.sample_window_s * 1e9)
        e = self._waveform.energy_j_at(np.concatenate([begin, end]))
        n = t.shape[0]
        power_w = (e[n:] - e[:n]) / m.sample_window_s
        return self.to_unix_us(t), np.round(power_w * 1e3).astype(np.int64)

    def last_update_ns(self, now_ns: int) -> int | None:
        """When the 100 ms readings (instant, average, energy) last ticked; None before any."""
        period_ns = round(self.model.update_period_s * 1e9)
        m = (now_ns - self.start_ns - self._update_offset_ns) // period_ns
        if m < 0:
            return None
        return self.start_ns + self._update_offset_ns + m * period_ns

    def _window_mean_mw(self, now_ns: int, window_s: float) -> int:
        u = self.last_update_ns(now_ns)
        if u is None:
            return round(self.model.idle_w * 1e3)
        a = max(self.start_ns, u - round(window_s * 1e9))
        return round(self.mean_power_w(a, u) * 1e3)

    def instant_power_mw(self, now_ns: int) -> int:
        """``NVML_FI_DEV_POWER_INSTANT``: mean over only the last 25 ms of each 100 ms period."""
        return self._window_mean_mw(now_ns, self.model.instant_window_s)

    def average_power_mw(self, now_ns: int) -> int:
        """``nvmlDeviceGetPowerUsage``: a 1 s boxcar, refreshed every 100 ms."""
        return self._window_mean_mw(now_ns, self.model.average_window_s)

    def energy_mj(self, now_ns: int) -> int:
        """``nvmlDeviceGetTotalEnergyConsumption``: mJ since "driver load", ticks every 100 ms."""
        u = self.last_update_ns(now_ns)
        if u is None:
            return self.energy_offset_mj
        since_start_j = self.energy_since_start_j(u)
        return self.energy_offset_mj + math.floor(since_start_j * 1e3)

    def utilisation_pct(self, now_ns: int) -> tuple[int, int]:
        """(gpu %, memory %) averaged over the last 100 ms update period."""
        u = self.last_update_ns(now_ns)
        if u is None:
            return 0, 0
        a_ns = max(self.start_ns, u - round(self.model.update_period_s * 1e9))
        busy = self._waveform.busy_at(np.array([a_ns, u]))
        frac = float(busy[1] - busy[0]) / max((u - a_ns) * 1e-9, 1e-9)
        return round(100 * frac), round(60 * frac)

    def describe(self) -> dict[str, Any]:
        """Identity and settings, for logs and the demo's run file."""
        return {
            "index": self.index,
            "seed": self.seed,
            "name": self.model.name,
            "uuid": self.uuid,
            "serial": self.serial,
            "power_limit_w": self.power_limit_w,
            "locked_clocks_mhz": self.locked_clocks_mhz,
            "mem_clock_mhz": self.mem_clock_mhz,
            "schedule_s": self.schedule.duration_s,
        }


def simulated_gpus(
    count: int, seed: int, schedules: Sequence[WorkloadSchedule] | None = None, **kwargs: Any
) -> list[SimulatedGpu]:
    """``count`` GPUs with distinct seeds/identities sharing one clock (for the demo)."""
    return [
        SimulatedGpu(
            index=i, seed=seed + i, schedule=None if schedules is None else schedules[i], **kwargs
        )
        for i in range(count)
    ]
