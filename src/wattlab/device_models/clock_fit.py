"""Device clock → host clock: offset and drift by the lower envelope of the time pairs.

Why a lower envelope and not least squares: a host stamps a sample when it *reads* it, and
read latency (USB polling, scheduling) only ever makes the host time late. The true line
``t_host = offset + scale · t_device`` therefore lies at or below every point; the line that
stays below all points and is as high as possible on average is the lower convex hull's
edge over the mean device time (the solution of the linear programme "minimise the summed
residuals subject to residual ≥ 0"). Least squares would instead sit in the middle of the
latency distribution, biased late by its mean and spread by its tail.

Everything is done relative to the first point so int64 nanoseconds (and unix microsecond
device clocks ~1.7e15) keep full precision in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.errors import UsageError

# ns per raw unit for the raw-time kinds sources declare (SourceDescriptor.time_raw)
NOMINAL_NS_PER_UNIT: dict[str, float] = {
    "host_monotonic_ns": 1.0,
    "device_us_unwrapped": 1000.0,
    "device_unix_us": 1000.0,
    "device_ticks_3mhz": 1e9 / 3e6,
}
BLOCK = 64


@dataclass(frozen=True)
class ClockFit:
    """``t_host_ns ≈ host_ref_ns + ns_per_unit · (t_device − device_ref)``.

    ``drift_ppm`` is how much faster the device clock runs than its nominal rate, measured
    on the host clock; the residuals (host − fit, never negative for the fitted points) say
    how much read latency the fit removed and how straight the mapping is.
    """

    device_ref: float
    host_ref_ns: int
    ns_per_unit: float
    nominal_ns_per_unit: float
    n_points: int
    residual_p50_ns: float = 0.0
    residual_p99_ns: float = 0.0
    residual_max_ns: float = 0.0
    method: str = "lower_envelope"

    @property
    def drift_ppm(self) -> float:
        return (self.nominal_ns_per_unit / self.ns_per_unit - 1.0) * 1e6

    def to_host_ns(self, t_device: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Device times onto the host clock (int64 ns)."""
        dx = np.asarray(t_device, dtype=np.float64) - self.device_ref
        return self.host_ref_ns + np.round(dx * self.ns_per_unit).astype(np.int64)

    def residuals_ns(
        self, t_device: npt.ArrayLike, t_host_ns: npt.ArrayLike
    ) -> npt.NDArray[np.float64]:
        """Host time minus the fit (how late each host stamp is against the fit)."""
        host = np.asarray(t_host_ns, dtype=np.int64) - self.host_ref_ns
        dx = np.asarray(t_device, dtype=np.float64) - self.device_ref
        return host.astype(np.float64) - dx * self.ns_per_unit

    def with_residuals(self, residual_ns: npt.NDArray[np.float64]) -> ClockFit:
        """The same fit with residual statistics filled in."""
        if residual_ns.size == 0:
            return self
        p50, p99 = np.percentile(residual_ns, [50, 99])
        return ClockFit(self.device_ref, self.host_ref_ns, self.ns_per_unit,
                        self.nominal_ns_per_unit, self.n_points, float(p50), float(p99),
                        float(np.max(residual_ns)), self.method)

    def to_attrs(self) -> dict[str, Any]:
        """HDF5 attributes (plain numbers and strings) describing the fit."""
        return {
            "method": self.method,
            "device_ref": self.device_ref,
            "host_ref_ns": self.host_ref_ns,
            "ns_per_unit": self.ns_per_unit,
            "nominal_ns_per_unit": self.nominal_ns_per_unit,
            "drift_ppm": self.drift_ppm,
            "n_points": self.n_points,
            "residual_p50_ns": self.residual_p50_ns,
            "residual_p99_ns": self.residual_p99_ns,
            "residual_max_ns": self.residual_max_ns,
            "meaning": "t_host_ns = host_ref_ns + ns_per_unit * (time_raw - device_ref); "
                       "residual = host time - fit (read latency removed by the fit)",
        }


def lower_hull(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> npt.NDArray[np.intp]:
    """Indices of the lower convex hull of points sorted by x, then y (monotone chain)."""
    hull: list[int] = []
    for i in range(x.shape[0]):
        if hull and x[i] == x[hull[-1]]:
            continue  # same x: the first (lowest) point is the only hull candidate
        while len(hull) >= 2:
            o, a = hull[-2], hull[-1]
            cross = (x[a] - x[o]) * (y[i] - y[o]) - (y[a] - y[o]) * (x[i] - x[o])
            if cross > 0:
                break
            hull.pop()
        hull.append(i)
    return np.asarray(hull, dtype=np.intp)


def envelope_candidates(
    x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]
) -> npt.NDArray[np.intp]:
    """Indices of the points that can be on the global lower hull (for fitting in chunks).

    A point above the lower hull of its own chunk is above the hull of any superset, so
    keeping each chunk's hull vertices loses nothing. Long chunks are first reduced to the
    lowest point of every ``BLOCK`` consecutive samples: with the nominal slope removed, a
    block spans well under a nanosecond of drift, so this changes the fit by less than that.
    """
    order = np.lexsort((y, x))
    n = order.shape[0]
    if n > 4 * BLOCK:
        ys = y[order]
        full = n - n % BLOCK
        pick = np.argmin(ys[:full].reshape(-1, BLOCK), axis=1) + np.arange(0, full, BLOCK)
        if full < n:
            pick = np.append(pick, full + int(np.argmin(ys[full:])))
        order = order[pick]
    return order[lower_hull(x[order], y[order])]


def fit_lower_envelope(
    t_device: npt.ArrayLike,
    t_host_ns: npt.ArrayLike,
    nominal_ns_per_unit: float = 1.0,
) -> ClockFit:
    """Fit offset and drift of a device clock against host read times.

    ``nominal_ns_per_unit`` is the device clock's nominal tick in ns (1000 for µs); it is
    taken out before the hull is built so the geometry is well conditioned.
    """
    acc = EnvelopeAccumulator(nominal_ns_per_unit)
    acc.add(t_device, t_host_ns)
    fit = acc.fit()
    if fit is None:
        raise UsageError("clock fit needs at least one point")
    return fit


class EnvelopeAccumulator:
    """Builds one fit from data read in chunks (a run file too large to hold at once).

    Only hull candidates are kept, with their exact raw and host times, so the fitted line
    passes exactly through a measured point (no float rounding of large clock values).
    """

    def __init__(self, nominal_ns_per_unit: float = 1.0) -> None:
        if nominal_ns_per_unit <= 0:
            raise UsageError(f"nominal clock tick must be > 0 ns, got {nominal_ns_per_unit}")
        self.nominal = nominal_ns_per_unit
        self._dref: float | None = None
        self._href = 0
        self._raw: list[npt.NDArray[np.float64]] = []
        self._host: list[npt.NDArray[np.int64]] = []
        self._sum_x = 0.0
        self._n = 0

    def _xy(self, raw: npt.NDArray[np.float64], host: npt.NDArray[np.int64]) -> tuple[
        npt.NDArray[np.float64], npt.NDArray[np.float64]
    ]:
        x = (raw - (self._dref or 0.0)) * self.nominal
        return x, (host - self._href).astype(np.float64) - x

    def add(self, t_device: npt.ArrayLike, t_host_ns: npt.ArrayLike) -> None:
        raw = np.asarray(t_device)
        host = np.asarray(t_host_ns, dtype=np.int64)
        if raw.shape != host.shape or raw.ndim != 1:
            raise UsageError(f"clock fit needs two equal 1-D arrays, got {raw.shape} and "
                             f"{host.shape}")
        if raw.size == 0:
            return
        raw_f = raw.astype(np.float64)
        if self._dref is None:
            self._dref, self._href = float(raw_f[0]), int(host[0])
        x, y = self._xy(raw_f, host)
        keep = envelope_candidates(x, y)
        self._raw.append(raw_f[keep])
        self._host.append(host[keep])
        self._sum_x += float(np.sum(x))
        self._n += x.size

    def fit(self) -> ClockFit | None:
        """The fit over everything added so far (None before any data)."""
        if self._dref is None:
            return None
        raw, host = np.concatenate(self._raw), np.concatenate(self._host)
        x, y = self._xy(raw, host)
        keep = envelope_candidates(x, y)
        raw, host, x, y = raw[keep], host[keep], x[keep], y[keep]
        self._raw, self._host = [raw], [host]
        # the hull edge spanning the mean x is the LP optimum (see the module docstring)
        if x.shape[0] == 1:
            k, slope = 0, 0.0
        else:
            k = int(np.clip(np.searchsorted(x, self._sum_x / self._n) - 1, 0, x.shape[0] - 2))
            slope = float((y[k + 1] - y[k]) / (x[k + 1] - x[k]))
        return ClockFit(float(raw[k]), int(host[k]), self.nominal * (1.0 + slope), self.nominal,
                        self._n)
