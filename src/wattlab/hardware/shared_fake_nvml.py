"""The fake NVML of ``record --simulate --shared-processes``: its GPUs' clock starts at the reader.

Why: the simulated shared GPU has no process for its first ``IDLE_LEAD_S`` so that a
recording measures the card's idle before any process starts; the live per-pod energy
charges nothing until it has (docs/fleet.md). The fake is made when ``record`` parses its
options, the reader reads it only once the session runs: on a loaded machine that can be
seconds later, past the lead, and every pod/job counter then stays at 0 J (issue 34). So the
GPUs are made again, with the same seeds, at the first call that reads them over time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import SimulatedGpu

# calls that say what the GPU is and how it is set, not what it does (the run file's device
# description): they do not start its clock
STATIC_CALLS = frozenset({
    "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetSerial",
    "nvmlDeviceGetBoardPartNumber", "nvmlDeviceGetMigMode", "nvmlDeviceGetVirtualizationMode",
    "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetSupportedMemoryClocks",
    "nvmlDeviceGetSupportedGraphicsClocks",
})


class SharedFakeNvml(FakeNvml):
    """A fake NVML whose GPUs are ``make_gpus(start_ns)``, started at the first timed read."""

    def __init__(self, make_gpus: Callable[[int], list[SimulatedGpu]],
                 clock_ns: Callable[[], int]) -> None:
        super().__init__(make_gpus(clock_ns()))
        self._make_gpus, self._clock_ns = make_gpus, clock_ns
        self.started = False

    def _gpu(self, handle: Any, name: str) -> SimulatedGpu:
        if not self.started and name not in STATIC_CALLS:
            self._check_init(name)  # an uninitialised call fails as before, starting nothing
            self.gpus = self._make_gpus(self._clock_ns())
            self.started = True
        return super()._gpu(handle, name)
