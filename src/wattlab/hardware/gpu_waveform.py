"""The simulated GPU's true waveform: power, work and SM clock on a 1 ms grid, and temperature.

Why a module of its own: the simulated GPU (simulated_gpu.py) derives every NVML view from
one exact waveform, and keeping that waveform is a job of its own: it is computed lazily,
one second at a time, from the workload schedule and the settings in force (power cap,
clock locks); the schedule is the job as it runs at the default settings, and a setting
that slows the GPU stretches its busy time, as a real job's steps take longer at a lower
clock (or, on a published surface, the whole iteration as the surface says); a change
of settings recomputes it from that moment on; and it keeps only a bounded history, so an
hours-long session stays flat in memory. Cumulative sums at the bin edges make every
energy and work integral exact.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from wattlab.device_models import first_order_filter
from wattlab.errors import UsageError

if TYPE_CHECKING:
    from wattlab.hardware.simulated_gpu import GpuModel, WorkloadSchedule

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MS_NS = 1_000_000
BLOCK_MS = 1000  # the grid is computed lazily, one second at a time
# running integrals kept at the bin edges: energy, work, busy time, schedule time
CUMULATIVE = ("_cum_e", "_cum_work", "_cum_busy", "_cum_pos")


@dataclass(frozen=True)
class GpuSettings:
    """What the user set: the power cap and the clock locks, (min, max) MHz or None (free)."""

    power_limit_w: float
    locked_mhz: tuple[float, float] | None = None
    mem_locked_mhz: tuple[float, float] | None = None


class Waveform:
    """One GPU's true power, work and SM clock per 1 ms bin, with a bounded history.

    ``index`` and ``seed`` make the power ripple (and name the GPU in messages); times are
    in the units of ``clock_ns`` with the origin at ``start_ns``. Thread-safe.
    """

    def __init__(self, model: GpuModel, schedule: WorkloadSchedule, *, index: int, seed: int,
                 clock_ns: Callable[[], int], start_ns: int, history_s: float) -> None:
        self.model = model
        self.schedule = schedule
        self.index = index
        self.seed = seed
        self.clock_ns = clock_ns
        self.start_ns = start_ns
        self.settings = GpuSettings(model.default_power_limit_w)
        self._clocks_asc = np.array(sorted(model.sm_clocks_mhz), dtype=np.float64)
        self._f_max = float(self._clocks_asc[-1])
        self._f_min = float(self._clocks_asc[0])
        self._mem_max = float(max(model.mem_clocks_mhz))
        self._lock = threading.RLock()
        self._n = 0  # ms bins computed
        # the grid holds bins [_base, _n): array index = bin - _base; older bins are dropped
        self._history_bins = max(BLOCK_MS, round(history_s * 1e3))
        self._base = 0
        self._hold_bin: int | None = None  # never drop this bin or later ones
        self._cum_e = np.zeros(1 + 4 * BLOCK_MS)  # J since start, at bin edges
        self._cum_work = np.zeros(1 + 4 * BLOCK_MS)  # full-speed busy seconds at bin edges
        self._cum_busy = np.zeros(1 + 4 * BLOCK_MS)  # busy seconds at bin edges
        self._cum_pos = np.zeros(1 + 4 * BLOCK_MS)  # schedule time (s) at bin edges
        self._clk = np.zeros(4 * BLOCK_MS, dtype=np.uint16)
        # temperature at the start of each whole second from _temps_base on
        self._temps_base = 0
        self._temps_c: list[float] = [
            model.ambient_c + model.thermal_resistance_c_per_w * model.idle_w]

    # ------------------------------------------------------------------ settings

    def change(self, update: Callable[[GpuSettings], GpuSettings]) -> None:
        """Apply new settings from now on; the past keeps the waveform of the old ones."""
        with self._lock:
            k_now = max(0, math.ceil((self.clock_ns() - self.start_ns) / MS_NS))
            self._ensure(k_now)  # the past is computed with the old settings
            self._n = k_now
            del self._temps_c[k_now // BLOCK_MS + 1 - self._temps_base :]
            self.settings = update(self.settings)

    def mem_clock_now(self) -> float:
        """The highest supported memory clock within the lock (the lowest one if none is)."""
        locked = self.settings.mem_locked_mhz
        if locked is None:
            return self._mem_max
        lo, hi = locked
        inside = [c for c in self.model.mem_clocks_mhz if lo <= c <= hi]
        below = [c for c in self.model.mem_clocks_mhz if c <= hi]
        return float(max(inside or below or [min(self.model.mem_clocks_mhz)]))

    def hold_from(self, t_ns: int | None) -> None:
        """Keep the waveform from ``t_ns`` on, however old it gets (None: release)."""
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
            for name in CUMULATIVE:
                arr = getattr(self, name)
                arr[: n - cut + 1] = arr[cut : n + 1].copy()
            self._clk[: n - cut] = self._clk[cut:n].copy()
            self._base = keep
        if e + 1 - self._base > self._cum_e.shape[0]:
            size = max(2 * self._cum_e.shape[0], e + 1 - self._base)
            n = self._n - self._base
            for name in CUMULATIVE:
                grown = np.zeros(size)
                grown[: n + 1] = getattr(self, name)[: n + 1]
                setattr(self, name, grown)
            clk = np.zeros(size - 1, dtype=np.uint16)
            clk[:n] = self._clk[:n]
            self._clk = clk

    def _clock(self, u: FloatArray, f_top: float, base_w: FloatArray | float,
               limit_w: float) -> FloatArray:
        """SM clock at utilisation u: the top allowed, lowered where the cap binds."""
        m = self.model
        capped = base_w + u * m.dynamic_w * (f_top / self._f_max) ** m.clock_exponent > limit_w
        with np.errstate(divide="ignore", invalid="ignore"):
            f_cap = self._f_max * ((limit_w - base_w) / (u * m.dynamic_w)) ** (
                1 / m.clock_exponent)
        return np.asarray(np.where(capped, np.clip(f_cap, self._f_min, f_top), f_top))

    def _pace(self, f_top: float, mem_ratio: float, slow: float) -> Callable[[float], float]:
        """Schedule seconds per second at utilisation u, under the settings in force.

        The schedule is the job as it runs at the default settings; its busy share runs at
        the clock's speed relative to the default's (data loading and other idle time do
        not), or, following a published surface, the whole iteration as the surface says.
        """
        m, s = self.model, self.settings
        if m.response is not None:
            t_ratio = m.response.ratios(self.setting_values(f_top))[0]
            return lambda u: 1.0 / t_ratio

        def pace(u: float) -> float:
            ua = np.array([u])
            base = m.idle_w + (m.mem_idle_w + m.mem_dynamic_w * ua) * (mem_ratio - 1.0)
            speed = float(self._clock(ua, f_top, base, s.power_limit_w)[0]) / self._f_max / slow
            speed0 = float(self._clock(ua, self._f_max, m.idle_w,
                                       m.default_power_limit_w)[0]) / self._f_max
            return (1.0 - u + u * speed) / (1.0 - u + u * speed0)
        return pace

    def setting_values(self, f_top: float) -> dict[str, float]:
        """The settings in force as knob values: SM clock, memory clock, power limit."""
        return {"sm_clock": f_top, "mem_clock": self.mem_clock_now(),
                "power_limit": self.settings.power_limit_w}

    def _walk(self, n: int, e: int, pace: Callable[[float], float]) -> tuple[FloatArray,
                                                                                 FloatArray]:
        """(utilisation per bin of [n, e), schedule time at each bin's end), at ``pace``."""
        span_s = (e - n) * 1e-3
        pos0 = float(self._cum_pos[n - self._base])
        wall, pos, busy = [0.0], [pos0], [0.0]
        paces: dict[float, float] = {}
        for piece_s, u in self.schedule.pieces_from(pos0):
            r = paces.setdefault(u, pace(u))
            end_s = wall[-1] + piece_s / r
            run_s = piece_s
            if end_s >= span_s:  # the block ends inside this piece
                run_s, end_s = (span_s - wall[-1]) * r, span_s
            busy.append(busy[-1] + u * (end_s - wall[-1]))
            wall.append(end_s)
            pos.append(pos[-1] + run_s)
            if end_s >= span_s:
                break
        edges = np.arange(e - n + 1) * 1e-3
        util = np.diff(np.interp(edges, wall, busy)) * 1e3
        return util, np.interp(edges[1:], wall, pos)

    def _ensure(self, k_end: int) -> None:
        """Compute the waveform for bins [_n, k_end)."""
        m, s = self.model, self.settings
        while self._n < k_end:
            n = self._n
            block = n // BLOCK_MS
            e = (block + 1) * BLOCK_MS
            self._make_room(e)
            f_top = self._f_max
            if s.locked_mhz is not None:
                f_top = min(self._f_max, max(self._f_min, s.locked_mhz[1]))
            mem_ratio = self.mem_clock_now() / self._mem_max  # 1.0 at the default clock
            # the memory-bound share of the work slows with the memory clock
            slow = 1.0 + m.mem_bound_frac * (1.0 / mem_ratio - 1.0)
            u, pos = self._walk(n, e, self._pace(f_top, mem_ratio, slow))
            if m.response is not None:  # the surface says the power and the speed
                t_ratio, e_ratio = m.response.ratios(self.setting_values(f_top))
                f = np.full(u.shape, f_top)
                dyn = u * m.dynamic_w * e_ratio / t_ratio
                base: FloatArray | float = m.idle_w * e_ratio / t_ratio
                speed = np.full(u.shape, 1.0 / t_ratio)
            else:
                # memory power scales with the memory clock: 0 W change at the default clock
                base = m.idle_w + (m.mem_idle_w + m.mem_dynamic_w * u) * (mem_ratio - 1.0)
                f = self._clock(u, f_top, base, s.power_limit_w)
                dyn = u * m.dynamic_w * (f / self._f_max) ** m.clock_exponent
                speed = f / self._f_max / slow
            noise = self._noise(block)[n - block * BLOCK_MS :]
            ripple = (m.ripple_frac * dyn + m.ripple_floor_w) * noise
            power = np.maximum(base + dyn + ripple, 0.0)
            i, j = n - self._base, e - self._base
            self._cum_e[i + 1 : j + 1] = self._cum_e[i] + np.cumsum(power) * 1e-3
            self._cum_work[i + 1 : j + 1] = self._cum_work[i] + np.cumsum(u * speed) * 1e-3
            self._cum_busy[i + 1 : j + 1] = self._cum_busy[i] + np.cumsum(u) * 1e-3
            self._cum_pos[i + 1 : j + 1] = pos
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

    def energy_j_at(self, t_ns: npt.ArrayLike) -> FloatArray:
        """Exact energy from the start to each time (J)."""
        return self._cumulative("_cum_e", t_ns)

    def work_at(self, t_ns: npt.ArrayLike) -> FloatArray:
        """Work from the start to each time, in seconds of full-clock busy GPU."""
        return self._cumulative("_cum_work", t_ns)

    def busy_at(self, t_ns: npt.ArrayLike) -> FloatArray:
        """Busy seconds (utilisation integrated) from the start to each time."""
        return self._cumulative("_cum_busy", t_ns)

    def power_w_at(self, t_ns: npt.ArrayLike) -> FloatArray:
        """True power at each time: the value of its 1 ms bin."""
        with self._lock:
            k = self._kept_bins(t_ns)[1]
            return np.asarray((self._cum_e[k + 1] - self._cum_e[k]) * 1e3, dtype=np.float64)

    def sm_clock_mhz_at(self, t_ns: npt.ArrayLike) -> FloatArray:
        """SM clock (MHz, a supported clock) at each time."""
        with self._lock:
            k = self._kept_bins(t_ns)[1]  # first: it may replace the arrays
            return self._clk[k].astype(np.float64)

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
        e = self.energy_j_at(np.array([a, self.start_ns + round(b_s * 1e9)]))
        return float(e[1] - e[0]) / (b_s - a_s)
