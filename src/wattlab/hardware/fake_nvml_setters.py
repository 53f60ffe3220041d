"""The setters of the pynvml API on simulated GPUs: power limit and locked clocks.

Why apart from ``FakeNvml``: they need root on a real GPU and only tuning and sweeps call
them; the reading API is the rest of ``fake_nvml.py``.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from wattlab.hardware.simulated_gpu import SimulatedGpu


class FakeNvmlSetters:
    """Mixed into ``FakeNvml``, which gives ``_gpu`` (the handle's GPU, init checked)."""

    def _gpu(self, handle: Any, name: str) -> SimulatedGpu:
        raise NotImplementedError  # FakeNvml's

    def _settable(self, handle: Any, name: str) -> SimulatedGpu:
        gpu = self._gpu(handle, name)
        if not gpu.settable:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return gpu

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        """Set the power limit (mW); needs root on a real GPU."""
        gpu = self._settable(handle, "nvmlDeviceSetPowerManagementLimit")
        lo, hi = gpu.model.power_limit_range_w
        limit_mw = ctypes.c_uint(limit).value
        if not round(lo * 1000) <= limit_mw <= round(hi * 1000):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.set_power_limit_w(limit_mw / 1000)

    def nvmlDeviceSetGpuLockedClocks(
        self, handle: Any, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        """Lock the SM clock into [min, max] MHz; needs root on a real GPU."""
        gpu = self._settable(handle, "nvmlDeviceSetGpuLockedClocks")
        if minGpuClockMHz > maxGpuClockMHz:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.set_locked_clocks_mhz(minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        """Free the SM clock; needs root on a real GPU."""
        self._settable(handle, "nvmlDeviceResetGpuLockedClocks").reset_locked_clocks()

    def nvmlDeviceSetMemoryLockedClocks(
        self, handle: Any, minMemClockMHz: int, maxMemClockMHz: int
    ) -> None:
        """Lock the memory clock into [min, max] MHz; needs root on a real GPU."""
        gpu = self._settable(handle, "nvmlDeviceSetMemoryLockedClocks")
        if minMemClockMHz > maxMemClockMHz:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.set_locked_mem_clocks_mhz(minMemClockMHz, maxMemClockMHz)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: Any) -> None:
        """Free the memory clock; needs root on a real GPU."""
        self._settable(handle, "nvmlDeviceResetMemoryLockedClocks").reset_locked_mem_clocks()
