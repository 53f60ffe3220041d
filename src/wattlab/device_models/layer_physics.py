"""Time and power of one layer at a clock pair, from its FLOPs and bytes and a roofline.

Why a device model of its own: the clock planner (``wattlab layers``) plans on it for a real
GPU's supported pairs, and the simulated layer GPU executes on it; neither owns the other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from wattlab.device_models.roofline import Roofline

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LayerPhysics:
    """Time and power of a layer at a clock pair; top clocks are the defaults."""

    roofline: Roofline  # at the top clocks
    sm_clocks_mhz: tuple[int, ...]
    mem_clocks_mhz: tuple[int, ...]
    idle_w: float = 70.0
    sm_dynamic_w: float = 520.0  # SMs fully busy at the top clock
    sm_stall_frac: float = 0.3  # share of it burnt while the SMs wait on memory
    clock_exponent: float = 2.7  # P ∝ f·V², V rising with f
    mem_idle_w: float = 15.0  # memory power at the top memory clock, idle
    mem_dynamic_w: float = 120.0  # memory fully busy at the top memory clock
    overlap_frac: float = 0.15  # share of the shorter of compute and memory not hidden
    launch_s: float = 4e-6
    switch_s: float = 5e-4  # a clock change stalls the GPU this long (at idle power)
    # the supported (SM, memory) pairs where not every combination is (a real GPU's list)
    pairs_mhz: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_pairs(cls, base: LayerPhysics, pairs_mhz: list[tuple[int, int]],
                   roofline: Roofline | None = None) -> LayerPhysics:
        """``base``'s power model on another GPU's supported clock pairs (and roofline)."""
        return replace(base, roofline=roofline or base.roofline,
                       sm_clocks_mhz=tuple(sorted({sm for sm, _ in pairs_mhz})),
                       mem_clocks_mhz=tuple(sorted({m for _, m in pairs_mhz})),
                       pairs_mhz=tuple(pairs_mhz))

    @property
    def default_pair(self) -> tuple[int, int]:
        return max(self.sm_clocks_mhz), max(self.mem_clocks_mhz)

    def pairs(self) -> tuple[FloatArray, FloatArray]:
        """Every supported (SM, memory) clock pair, as two arrays."""
        if self.pairs_mhz:
            both = np.array(self.pairs_mhz, float)
            return both[:, 0], both[:, 1]
        sm, mem = np.meshgrid(np.array(self.sm_clocks_mhz, float),
                              np.array(self.mem_clocks_mhz, float), indexing="ij")
        return sm.ravel(), mem.ravel()

    def cost(self, work_flops: npt.ArrayLike, bytes_moved: npt.ArrayLike, sm_mhz: npt.ArrayLike,
             mem_mhz: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """(time s, power W), broadcast over layers and clock pairs."""
        s = np.asarray(sm_mhz, float) / max(self.sm_clocks_mhz)
        r = np.asarray(mem_mhz, float) / max(self.mem_clocks_mhz)
        t_c = np.asarray(work_flops, float) / (self.roofline.peak_flops * s)
        t_m = np.asarray(bytes_moved, float) / (self.roofline.bandwidth_bps * r)
        t = np.maximum(t_c, t_m) + self.overlap_frac * np.minimum(t_c, t_m) + self.launch_s
        u_c, u_m = t_c / t, t_m / t
        sm_w = self.sm_dynamic_w * s**self.clock_exponent * (
            self.sm_stall_frac + (1 - self.sm_stall_frac) * u_c)
        power = self.idle_w + self.mem_idle_w * r + sm_w + self.mem_dynamic_w * r * u_m
        return t, power

    def switch_cost(self) -> tuple[float, float]:
        """(time s, energy J) of one clock change."""
        return self.switch_s, self.switch_s * (self.idle_w + self.mem_idle_w)
