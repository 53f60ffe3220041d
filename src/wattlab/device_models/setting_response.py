"""How a workload's time and energy per iteration respond to the GPU's settings.

Why: a simulated GPU that follows a published surface (Zeus power-limit traces, Kernel
Tuner clock sweeps, ...) must run each iteration as long, and spend as much energy on it,
as the surface says at the setting in force, so that what a tuner measures on it can be
checked against the surface's own numbers. Between the table's settings the ratios are
interpolated linearly along each axis; outside, the nearest edge holds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.errors import UsageError

FloatArray = npt.NDArray[np.float64]
KNOBS = ("sm_clock", "mem_clock", "power_limit")


@dataclass(frozen=True)
class SettingResponse:
    """Time and energy per iteration over a grid of settings, relative to the default.

    ``axes``: knob (one of ``KNOBS``) -> ascending values; ``time_ratio`` and
    ``energy_ratio`` have one dimension per axis and are 1.0 at the default, the top of
    every axis. ``power_w`` is the mean power of an iteration at the default.
    """

    name: str
    axes: dict[str, tuple[float, ...]]
    time_ratio: FloatArray
    energy_ratio: FloatArray
    power_w: float

    def __post_init__(self) -> None:
        unknown = [k for k in self.axes if k not in KNOBS]
        shape = tuple(len(v) for v in self.axes.values())
        if unknown or self.time_ratio.shape != shape or self.energy_ratio.shape != shape:
            raise UsageError(f"setting response {self.name}: axes {list(self.axes)} do not "
                             f"match ratios of shape {self.time_ratio.shape}")
        if not (np.all(self.time_ratio > 0) and np.all(self.energy_ratio > 0)):
            raise UsageError(f"setting response {self.name}: ratios must be > 0")

    @classmethod
    def of_table(cls, name: str, axes: dict[str, tuple[float, ...]], energy_j: FloatArray,
                 time_s: FloatArray) -> SettingResponse:
        """From absolute energy and time per iteration; the default is the top setting."""
        top = tuple(len(v) - 1 for v in axes.values())
        e0, t0 = float(energy_j[top]), float(time_s[top])
        return cls(name, axes, np.asarray(time_s, float) / t0, np.asarray(energy_j, float) / e0,
                   e0 / t0)

    def ratios(self, setting: dict[str, float]) -> tuple[float, float]:
        """(time ratio, energy ratio) at a setting; knobs it does not name stay at the top."""
        corners: list[list[tuple[int, float]]] = []
        for knob, values in self.axes.items():
            v = np.asarray(values)
            x = float(np.clip(setting.get(knob, v[-1]), v[0], v[-1]))
            hi = int(np.clip(np.searchsorted(v, x), 1, len(v) - 1)) if len(v) > 1 else 0
            lo = max(hi - 1, 0)
            w = 0.0 if hi == lo else (x - v[lo]) / (v[hi] - v[lo])
            corners.append([(lo, 1.0 - w), (hi, w)])
        t = e = 0.0
        for combo in itertools.product(*corners):
            weight = float(np.prod([w for _, w in combo]))
            if weight:
                idx = tuple(i for i, _ in combo)
                t += weight * float(self.time_ratio[idx])
                e += weight * float(self.energy_ratio[idx])
        return t, e
