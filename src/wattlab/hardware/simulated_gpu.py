"""A simulated GPU whose power, clocks and NVML views behave like a real H100's.

Why: the NVML reader, the calibration and the sweep must run (and be tested) on machines
without a GPU, against a device whose *true* power is known exactly. The simulator keeps the
true power piecewise-constant on a 1 ms grid (cumulative sums make every energy integral
exact) and derives each NVML view from it with the artefacts measured on a real H100
(PROTOCOLS.md §7): a 50 Hz sample buffer, a "part-time" instant reading, a 1 s boxcar
average and an energy counter that tick every 100 ms.

Everything is deterministic for a given seed; times are in the units of ``clock_ns``
(``time.monotonic_ns`` by default) with the origin at construction (or ``start_ns``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.device_models import WorkloadSchedule, first_order_filter
from wattlab.errors import UsageError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MS_NS = 1_000_000
BLOCK_MS = 1000  # the grid is computed lazily, one second at a time
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
        m = self.model
        self._clocks_asc = np.array(sorted(m.sm_clocks_mhz), dtype=np.float64)
        self._f_max = float(self._clocks_asc[-1])
        self._f_min = float(self._clocks_asc[0])
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
        self._power_limit_w = m.default_power_limit_w
        self._locked_mhz: tuple[float, float] | None = None
        self._mem_locked_mhz: tuple[float, float] | None = None
        self._mem_max = float(max(m.mem_clocks_mhz))
        self._lock = threading.RLock()
        self._n = 0  # ms bins computed
        # the grid holds bins [_base, _n): array index = bin - _base; older bins are dropped
        self._history_bins = max(BLOCK_MS, round(history_s * 1e3))
        self._base = 0
        self._hold_bin: int | None = None  # never drop this bin or later ones
        self._cum_e = np.zeros(1 + 4 * BLOCK_MS)  # J since start, at bin edges
        self._cum_work = np.zeros(1 + 4 * BLOCK_MS)  # full-speed busy seconds at bin edges
        self._clk = np.zeros(4 * BLOCK_MS, dtype=np.uint16)
        # temperature at the start of each whole second from _temps_base on
        self._temps_base = 0
        self._temps_c: list[float] = [m.ambient_c + m.thermal_resistance_c_per_w * m.idle_w]

    # ------------------------------------------------------------------ settings

    @property
    def power_limit_w(self) -> float:
        """The power cap in force now (W)."""
        return self._power_limit_w

    @property
    def locked_clocks_mhz(self) -> tuple[float, float] | None:
        """(min, max) SM clock lock in force now, or None when the clock is free."""
        return self._locked_mhz

    def set_power_limit_w(self, limit_w: float) -> None:
        """Change the power cap from now on (the past keeps its waveform)."""
        lo, hi = self.model.power_limit_range_w
        if not lo <= limit_w <= hi:
            raise UsageError(
                f"simulated GPU {self.index}: power limit {limit_w} W is outside {lo:g}-{hi:g} W"
            )
        with self._lock:
            self._settings_changed()
            self._power_limit_w = float(limit_w)

    def set_locked_clocks_mhz(self, min_mhz: float, max_mhz: float) -> None:
        """Lock the SM clock into [min, max] from now on; the power cap still wins."""
        if min_mhz > max_mhz:
            raise UsageError(f"simulated GPU {self.index}: locked clocks {min_mhz} > {max_mhz}")
        with self._lock:
            self._settings_changed()
            self._locked_mhz = (float(min_mhz), float(max_mhz))

    def reset_locked_clocks(self) -> None:
        """Free the SM clock from now on."""
        with self._lock:
            self._settings_changed()
            self._locked_mhz = None

    @property
    def mem_clock_mhz(self) -> int:
        """Memory clock in force now (MHz): the top one unless a lock says otherwise."""
        return round(self._mem_clock_now())

    @property
    def locked_mem_clocks_mhz(self) -> tuple[float, float] | None:
        """(min, max) memory clock lock in force now, or None when the clock is free."""
        return self._mem_locked_mhz

    def _mem_clock_now(self) -> float:
        """The highest supported memory clock within the lock (the lowest one if none is)."""
        if self._mem_locked_mhz is None:
            return self._mem_max
        lo, hi = self._mem_locked_mhz
        inside = [c for c in self.model.mem_clocks_mhz if lo <= c <= hi]
        below = [c for c in self.model.mem_clocks_mhz if c <= hi]
        return float(max(inside or below or [min(self.model.mem_clocks_mhz)]))

    def set_locked_mem_clocks_mhz(self, min_mhz: float, max_mhz: float) -> None:
        """Lock the memory clock into [min, max] from now on."""
        if min_mhz > max_mhz:
            raise UsageError(
                f"simulated GPU {self.index}: locked memory clocks {min_mhz} > {max_mhz}"
            )
        with self._lock:
            self._settings_changed()
            self._mem_locked_mhz = (float(min_mhz), float(max_mhz))

    def reset_locked_mem_clocks(self) -> None:
        """Free the memory clock (back to the top one) from now on."""
        with self._lock:
            self._settings_changed()
            self._mem_locked_mhz = None

    def _settings_changed(self) -> None:
        """Forget the waveform from now on, so it is recomputed with the new settings."""
        k_now = max(0, math.ceil((self.clock_ns() - self.start_ns) / MS_NS))
        self._ensure(k_now)  # the past is computed with the old settings
        self._n = k_now
        del self._temps_c[k_now // BLOCK_MS + 1 - self._temps_base :]

    def hold_history_from(self, t_ns: int | None) -> None:
        """Keep the waveform from ``t_ns`` on, however old it gets (None: release).

        A sweep run asks for its true energy and work since the run began, which may be
        longer ago than the history the grid keeps.
        """
        with self._lock:
            if t_ns is None:
                self._hold_bin = None
                return
            k = int(np.floor(self._rel_ms([t_ns])[0]))
            self._check_kept(k, t_ns)
            self._hold_bin = k

    # ------------------------------------------------------------------ the grid

    def _noise(self, block: int) -> FloatArray:
        """Unit-variance correlated ripple for one block, a pure function of the block."""
        rng = np.random.default_rng([self.seed, self.index, block])
        white = rng.standard_normal(BLOCK_MS + 1)
        rho = math.exp(-1.0 / self.model.ripple_corr_ms)
        gain = math.sqrt(1.0 - rho * rho)
        return first_order_filter(white[1:], rho, gain, white[0])

    def _check_kept(self, k_min: int, t_ns: Any) -> None:
        if k_min < self._base:
            raise UsageError(
                f"simulated GPU {self.index}: time {t_ns} ns is {(self._n - k_min) / 1e3:.1f} s "
                f"back; the simulator keeps the last {self._history_bins / 1e3:g} s of its "
                "waveform (hold_history_from keeps more)")

    def _make_room(self, e: int) -> None:
        """Room for bins up to ``e``: drop bins older than the history, or grow the arrays."""
        if e + 1 - self._base <= self._cum_e.shape[0]:
            return
        keep = (self._n - self._history_bins) // BLOCK_MS * BLOCK_MS
        if self._hold_bin is not None:
            keep = min(keep, self._hold_bin // BLOCK_MS * BLOCK_MS)
        if keep > self._base:
            self._advance_temps(keep // BLOCK_MS)  # needs the bins about to go
            del self._temps_c[: keep // BLOCK_MS - self._temps_base]
            self._temps_base = keep // BLOCK_MS
            cut, n = keep - self._base, self._n - self._base
            for name in ("_cum_e", "_cum_work"):
                arr = getattr(self, name)
                arr[: n - cut + 1] = arr[cut : n + 1].copy()
            self._clk[: n - cut] = self._clk[cut:n].copy()
            self._base = keep
        if e + 1 - self._base > self._cum_e.shape[0]:
            size = max(2 * self._cum_e.shape[0], e + 1 - self._base)
            n = self._n - self._base
            for name in ("_cum_e", "_cum_work"):
                grown = np.zeros(size)
                grown[: n + 1] = getattr(self, name)[: n + 1]
                setattr(self, name, grown)
            clk = np.zeros(size - 1, dtype=np.uint16)
            clk[:n] = self._clk[:n]
            self._clk = clk

    def _ensure(self, k_end: int) -> None:
        """Compute the waveform for bins [_n, k_end)."""
        m = self.model
        while self._n < k_end:
            n = self._n
            block = n // BLOCK_MS
            e = (block + 1) * BLOCK_MS
            self._make_room(e)
            k = np.arange(n, e, dtype=np.float64)
            u = np.diff(self.schedule.integral(np.append(k, e) * 1e-3)) * 1e3
            f_top = self._f_max
            if self._locked_mhz is not None:
                f_top = min(self._f_max, max(self._f_min, self._locked_mhz[1]))
            dyn_top = u * m.dynamic_w * (f_top / self._f_max) ** m.clock_exponent
            mem_ratio = self._mem_clock_now() / self._mem_max  # 1.0 at the default clock
            # memory power scales with the memory clock: 0 W change at the default clock
            base = m.idle_w + (m.mem_idle_w + m.mem_dynamic_w * u) * (mem_ratio - 1.0)
            headroom = self._power_limit_w - base
            capped = base + dyn_top > self._power_limit_w
            with np.errstate(divide="ignore", invalid="ignore"):
                f_cap = self._f_max * (headroom / (u * m.dynamic_w)) ** (1 / m.clock_exponent)
            f = np.where(capped, np.clip(f_cap, self._f_min, f_top), f_top)
            dyn = u * m.dynamic_w * (f / self._f_max) ** m.clock_exponent
            noise = self._noise(block)[n - block * BLOCK_MS :]
            ripple = (m.ripple_frac * dyn + m.ripple_floor_w) * noise
            power = np.maximum(base + dyn + ripple, 0.0)
            i, j = n - self._base, e - self._base
            self._cum_e[i + 1 : j + 1] = self._cum_e[i] + np.cumsum(power) * 1e-3
            # the memory-bound share of the work slows with the memory clock
            slow = 1.0 + m.mem_bound_frac * (1.0 / mem_ratio - 1.0)
            work = np.cumsum(u * f / self._f_max / slow) * 1e-3
            self._cum_work[i + 1 : j + 1] = self._cum_work[i] + work
            nearest = np.searchsorted(self._clocks_asc, f)
            lower = np.clip(nearest - 1, 0, len(self._clocks_asc) - 1)
            upper = np.clip(nearest, 0, len(self._clocks_asc) - 1)
            pick = np.where(f - self._clocks_asc[lower] < self._clocks_asc[upper] - f, lower, upper)
            self._clk[i:j] = self._clocks_asc[pick].astype(np.uint16)
            self._n = e

    def _rel_ms(self, t_ns: npt.ArrayLike) -> FloatArray:
        return np.maximum((np.asarray(t_ns, dtype=np.float64) - self.start_ns) / MS_NS, 0.0)

    def _kept_bins(self, t_ns: npt.ArrayLike) -> tuple[FloatArray, IntArray]:
        """(time in ms since start, array index of its bin), the grid computed that far.

        Call with the lock held.
        """
        x = self._rel_ms(t_ns)
        k = np.floor(x).astype(np.int64)
        self._ensure(int(k.max(initial=0)) + 1)
        self._check_kept(int(k.min(initial=self._base)), t_ns)
        return x - self._base, k - self._base

    def _cumulative(self, arr_name: str, t_ns: npt.ArrayLike) -> FloatArray:
        """Exact running integral since start at times t: each bin is piecewise constant."""
        with self._lock:
            x, k = self._kept_bins(t_ns)
            cum = getattr(self, arr_name)
            return np.asarray(cum[k] + (cum[k + 1] - cum[k]) * (x - k), dtype=np.float64)

    # ------------------------------------------------------------------ true quantities

    def true_power_w_array(self, t_ns: npt.ArrayLike) -> FloatArray:
        """True power at each time: the value of its 1 ms bin."""
        with self._lock:
            k = self._kept_bins(t_ns)[1]
            return np.asarray((self._cum_e[k + 1] - self._cum_e[k]) * 1e3, dtype=np.float64)

    def true_power_w(self, t_ns: int) -> float:
        """True power at one time (W)."""
        return float(self.true_power_w_array(np.array([t_ns]))[0])

    def true_energy_j(self, t0_ns: int, t1_ns: int) -> float:
        """Exact energy between two times (J)."""
        e = self._cumulative("_cum_e", np.array([t0_ns, t1_ns]))
        return float(e[1] - e[0])

    def energy_since_start_j(self, t_ns: int) -> float:
        """Exact energy from the start to ``t_ns`` (J): what a running counter has added."""
        return float(self._cumulative("_cum_e", np.array([t_ns]))[0])

    def mean_power_w(self, t0_ns: int, t1_ns: int) -> float:
        """Exact mean true power over [t0, t1] (W)."""
        if t1_ns <= t0_ns:
            raise UsageError(f"mean power needs t1 > t0, got {t0_ns}..{t1_ns}")
        return self.true_energy_j(t0_ns, t1_ns) / ((t1_ns - t0_ns) * 1e-9)

    def work_done(self, t0_ns: int, t1_ns: int) -> float:
        """Work done between two times, in seconds of full-clock busy GPU (clock times util)."""
        w = self._cumulative("_cum_work", np.array([t0_ns, t1_ns]))
        return float(w[1] - w[0])

    def sm_clock_mhz_array(self, t_ns: npt.ArrayLike) -> FloatArray:
        """SM clock (MHz, a supported clock) at each time."""
        with self._lock:
            k = self._kept_bins(t_ns)[1]  # first: it may replace the arrays
            return self._clk[k].astype(np.float64)

    def sm_clock_mhz(self, t_ns: int) -> int:
        """SM clock (MHz) at one time."""
        return int(self.sm_clock_mhz_array(np.array([t_ns]))[0])

    def utilisation(self, t_ns: int) -> float:
        """Scheduled utilisation (0..1) at one time."""
        return float(self.schedule.utilisation_at((t_ns - self.start_ns) * 1e-9))

    def temperature_c(self, t_ns: int) -> float:
        """GPU temperature: a first-order lag (tau ~20 s) behind the power, stepped per second."""
        m = self.model
        x_s = max(0.0, (t_ns - self.start_ns) * 1e-9)
        whole = int(x_s)
        with self._lock:
            self._advance_temps(whole)
            self._check_kept(whole * BLOCK_MS, t_ns)  # older than the history: says so
            t0 = self._temps_c[whole - self._temps_base]
        dt = x_s - whole
        if dt <= 0:
            return t0
        t_ss = m.ambient_c + m.thermal_resistance_c_per_w * self._mean_power_rel_s(whole, x_s)
        return t_ss + (t0 - t_ss) * math.exp(-dt / m.thermal_tau_s)

    def _advance_temps(self, whole: int) -> None:
        """Temperatures at the start of every second up to ``whole`` (lock held)."""
        m = self.model
        decay = math.exp(-1.0 / m.thermal_tau_s)
        while self._temps_base + len(self._temps_c) <= whole:
            j = self._temps_base + len(self._temps_c) - 1
            p = self._mean_power_rel_s(j, j + 1)
            t_ss = m.ambient_c + m.thermal_resistance_c_per_w * p
            self._temps_c.append(t_ss + (self._temps_c[-1] - t_ss) * decay)

    def _mean_power_rel_s(self, a_s: float, b_s: float) -> float:
        a = self.start_ns + round(a_s * 1e9)
        return self.true_energy_j(a, self.start_ns + round(b_s * 1e9)) / (b_s - a_s)

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
        e = self._cumulative("_cum_e", np.concatenate([begin, end]))
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
        since_start_j = float(self._cumulative("_cum_e", np.array([u]))[0])
        return self.energy_offset_mj + math.floor(since_start_j * 1e3)

    def utilisation_pct(self, now_ns: int) -> tuple[int, int]:
        """(gpu %, memory %) averaged over the last 100 ms update period."""
        u = self.last_update_ns(now_ns)
        if u is None:
            return 0, 0
        a_s = max(0.0, (u - self.start_ns) * 1e-9 - self.model.update_period_s)
        b_s = (u - self.start_ns) * 1e-9
        busy = self.schedule.integral(np.array([a_s, b_s]))
        frac = float(busy[1] - busy[0]) / max(b_s - a_s, 1e-9)
        return round(100 * frac), round(60 * frac)

    def describe(self) -> dict[str, Any]:
        """Identity and settings, for logs and the demo's run file."""
        return {
            "index": self.index,
            "seed": self.seed,
            "name": self.model.name,
            "uuid": self.uuid,
            "serial": self.serial,
            "power_limit_w": self._power_limit_w,
            "locked_clocks_mhz": self._locked_mhz,
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
