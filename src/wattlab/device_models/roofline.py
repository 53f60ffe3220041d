"""Peak FLOP/s and memory bandwidth of a GPU, and which layers each one bounds.

Why measured: a datasheet's peak is rarely reached; a large matrix product and a large
copy on the GPU at hand give the roofline a layer actually meets. The simulated GPU has a
table instead (an H100 SXM's datasheet figures), which its layer physics uses too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from wattlab.errors import UsageError

# the simulated GPU: an H100 SXM's dense peaks (FLOP/s) per dtype and HBM3 bandwidth (B/s)
SIMULATED_PEAK_FLOPS = {"float32": 67e12, "float16": 989e12, "bfloat16": 989e12}
SIMULATED_BANDWIDTH_BPS = 3.35e12


@dataclass(frozen=True)
class Roofline:
    """A GPU's compute and memory ceilings at its default clocks."""

    peak_flops: float  # FLOP/s
    bandwidth_bps: float  # bytes/s
    source: str  # how the numbers were found

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which a layer is compute-bound."""
        return self.peak_flops / self.bandwidth_bps

    def bound(self, intensity: float) -> str:
        return "compute" if intensity >= self.ridge else "memory"


def simulated_roofline(dtype: str) -> Roofline:
    return Roofline(SIMULATED_PEAK_FLOPS[dtype], SIMULATED_BANDWIDTH_BPS,
                    "table: simulated H100 SXM")


def measure_roofline(dtype: str, size: int = 8192, copy_bytes: int = 1 << 30,
                     repeats: int = 20) -> Roofline:
    """Peak FLOP/s (square matrix product) and bandwidth (device copy) on the current GPU."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError("measuring the roofline needs a CUDA GPU (or --simulate)")
    dt = getattr(torch, dtype)
    a = torch.randn(size, size, device="cuda", dtype=dt)
    b = torch.randn(size, size, device="cuda", dtype=dt)
    src = torch.empty(copy_bytes // 4, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)

    def best_s(fn: Any) -> float:
        fn()
        best = math.inf
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / repeats)
        return best

    mm_s = best_s(lambda: torch.mm(a, b))
    copy_s = best_s(lambda: dst.copy_(src))
    name = torch.cuda.get_device_name()
    return Roofline(2 * size**3 / mm_s, 2 * copy_bytes / copy_s,
                    f"measured on {name}: {size}² {dtype} matmul, {copy_bytes >> 20} MiB copy")
