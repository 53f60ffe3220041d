"""How far each NVML power view is from the GPU's own energy counter, window by window.

Why: NVML offers three power views — the 50 Hz sample buffer, the instant reading, and the
1 s average that `nvmlDeviceGetPowerUsage` returns — and users ask which one to trust at
which time scale. The energy counter is the driver's own integral, updated every 100 ms;
read at its update rate and placed on its update lattice (``counter_ticks.at_updates``),
its difference over a window between two updates is exact to its 1 mJ resolution. Each
view's integral over the same windows, compared to it, gives the agreement at 0.1 s, 1 s
and 10 s. This is agreement with the driver, not accuracy: the counter is the driver's
own figure, not an external reference (that is `wattlab calibrate` and `qualify`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import integrate_view
from wattlab.analysis.energy import COUNTER_UPDATE_S, at_updates
from wattlab.errors import UsageError
from wattlab.runfile import Run

FloatArray = npt.NDArray[np.float64]

WINDOWS_S = (0.1, 1.0, 10.0)
COUNTER_READ_MAX_S = 0.15
"""The counter must be read at least this often to pin every 100 ms update."""
VIEWS = (("50 Hz buffer", "samples", "power_w"),
         ("instant", "power", "instant_power_w"),
         ("1 s average", "power", "average_power_w"))
"""(name, stream suffix, channel) of each view, as `wattlab record --nvml` stores them."""


@dataclass(frozen=True)
class Agreement:
    """One view at one window length: |view − counter| / counter over whole windows."""

    view: str
    window_s: float
    windows: int
    median_abs_pct: float
    p95_abs_pct: float
    median_pct: float  # signed: a view that reads high on the whole is positive

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def counter_updates(run: Run, device: str) -> tuple[FloatArray, FloatArray]:
    """The energy counter's values at its update instants (s, J)."""
    source = f"{device}.energy"
    if source not in run.sources:
        raise UsageError(f"{run.path}: no {source} stream (record with --nvml)")
    counter = run.source(source)
    reads_s = counter.time_ns.astype(np.float64) / 1e9
    if reads_s.size < 3 or float(np.median(np.diff(reads_s))) > COUNTER_READ_MAX_S:
        spacing = float(np.median(np.diff(reads_s))) if reads_s.size > 1 else float("nan")
        raise UsageError(
            f"{run.path}: {source} was read every {spacing:.2f} s; the agreement needs it read "
            f"at its update rate: record with --nvml-intervals energy=0.1")
    return at_updates(reads_s, counter.channel("energy_j").astype(np.float64))


def view_agreement(run: Run, device: str = "gpu0") -> list[Agreement]:
    """Every view present against the counter, at 0.1 s, 1 s and 10 s windows."""
    t_s, energy_j = counter_updates(run, device)
    out = []
    for name, suffix, channel in VIEWS:
        source = f"{device}.{suffix}"
        if source not in run.sources or channel not in run.source(source).channel_names:
            continue
        view = run.source(source)
        first, last = view.time_ns[[0, -1]] / 1e9
        inside = (t_s >= first) & (t_s <= last)
        tu, ju = t_s[inside], energy_j[inside]
        cum = integrate_view(view, [channel], tu)[0]
        for window_s in WINDOWS_S:
            step = round(window_s / COUNTER_UPDATE_S)
            a = np.arange(0, tu.size - step, step)
            b = a + step
            e_counter = ju[b] - ju[a]
            e_view = cum.integral[b] - cum.integral[a]
            covered = (cum.uncovered_s[b] - cum.uncovered_s[a]) <= 0
            ok = covered & (e_counter > 0)
            if not ok.any():
                continue
            pct = 100.0 * (e_view[ok] - e_counter[ok]) / e_counter[ok]
            out.append(Agreement(name, window_s, int(ok.sum()),
                                 float(np.median(np.abs(pct))),
                                 float(np.percentile(np.abs(pct), 95)), float(np.median(pct))))
    if not out:
        raise UsageError(f"{run.path}: no NVML power view of {device} overlaps its counter")
    return out
