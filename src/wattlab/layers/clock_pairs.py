"""The clock pairs a plan may choose on a real GPU: its own supported list, from NVML.

Why: a plan for an H100 PCIe or an A100 must not pick the simulated H100 SXM's clocks.
NVML lists the supported memory clocks and, per memory clock, the SM clocks (read-only
queries; nothing is set). Where that fails (no NVML, a GPU that does not list them) the
simulated list is used and the record says why.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from wattlab.device_models import LayerPhysics, Roofline
from wattlab.errors import WattlabError
from wattlab.runfile import ClockSource


def physics_for_gpu(base: LayerPhysics, roofline: Roofline, gpu: int, driver: Any = None
                    ) -> tuple[LayerPhysics, ClockSource]:
    """The simulated power model with GPU ``gpu``'s clock pairs and roofline, and its source.

    ``driver``: an ``NvmlDriver`` (the fake NVML in tests); by default pynvml's.
    """
    try:
        if driver is None:
            from wattlab.drivers.nvml import NvmlDriver

            driver = NvmlDriver()
        driver.open()
        try:
            pairs = driver.supported_clock_pairs(gpu)
        finally:
            driver.close()
    except (WattlabError, ImportError) as e:
        return replace(base, roofline=roofline), ClockSource(
            source="simulated H100 list", reason=str(e), pairs=len(base.pairs()[0]))
    return LayerPhysics.from_pairs(base, pairs, roofline), ClockSource(
        source=f"NVML, GPU {gpu}", pairs=len(pairs),
        mem_mhz=tuple(sorted({m for _, m in pairs}, reverse=True)),
        sm_mhz_range=(min(sm for sm, _ in pairs), max(sm for sm, _ in pairs)))
