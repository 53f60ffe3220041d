"""The per-process calls of the pynvml API on simulated GPUs, as nvidia-ml-py answers them.

Why apart from ``FakeNvml``: its reading API is the rest of ``fake_nvml.py``; these answer
from the processes sharing a simulated GPU (``shared_gpu.py``), and ``process_query_error``
(an ``NVML_ERROR_*`` code, settable mid-run) makes them refuse, as an old driver, a vGPU or
a GPU without permission does. ``wattlab_process_identity`` and ``wattlab_simulated_truth``
are no NVML calls: they tell the reader what /proc and the physics would say of a
simulated process, which no real library has.
"""

from __future__ import annotations

from typing import Any

import pynvml

from wattlab.hardware.simulated_gpu import SimulatedGpu

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a GPU without MIG


class FakeNvmlProcesses:
    """Mixed into ``FakeNvml``, which gives ``_gpu`` (the handle's GPU, init checked)."""

    gpus: list[SimulatedGpu]
    process_query_error: int | None = None

    def _gpu(self, handle: Any, name: str) -> SimulatedGpu:
        raise NotImplementedError  # FakeNvml's

    def _process_gpu(self, handle: Any, name: str) -> SimulatedGpu:
        gpu = self._gpu(handle, name)
        if self.process_query_error is not None:
            raise pynvml.NVMLError(self.process_query_error)
        return gpu

    def _seconds(self, gpu: SimulatedGpu, t_ns: int) -> float:
        return (t_ns - gpu.start_ns) / 1e9

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        """Samples newer than ``timeStamp`` (unix µs); NOT_FOUND when there are none.

        A list of ``c_nvmlProcessUtilizationSample_t``, as pynvml's slice of its array.
        """
        gpu = self._process_gpu(handle, "nvmlDeviceGetProcessUtilization")
        load = gpu.processes
        now = gpu.clock_ns()
        since_s = self._seconds(gpu, (int(timeStamp) - 1) * 1000 - gpu.unix_offset_ns)
        found = [] if load is None else load.utilisation_samples(self._seconds(gpu, now),
                                                                 since_s)
        rows = [(pid, stamp_us, sm, mem) for pid, t_s, sm, mem in found
                if (stamp_us := int(gpu.to_unix_us(gpu.start_ns + round(t_s * 1e9))))
                > timeStamp]  # compared in the driver's unit: a stamp seen is never repeated
        if not rows:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        out = (pynvml.c_nvmlProcessUtilizationSample_t * len(rows))()
        for i, (pid, stamp_us, sm, mem) in enumerate(rows):
            out[i].pid, out[i].timeStamp = pid, stamp_us
            out[i].smUtil, out[i].memUtil, out[i].encUtil, out[i].decUtil = sm, mem, 0, 0
        return out[0:len(rows)]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """Processes with a compute context: pynvml's friendly objects (pid, usedGpuMemory)."""
        gpu = self._process_gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        load = gpu.processes
        if load is None:
            return []
        return [pynvml.nvmlFriendlyObject({
            "pid": p.pid, "usedGpuMemory": p.used_memory_b, "gpuInstanceId": NO_INSTANCE,
            "computeInstanceId": NO_INSTANCE})
            for p in load.running(self._seconds(gpu, gpu.clock_ns()))]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        """No simulated process draws graphics."""
        self._process_gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return []

    def wattlab_process_identity(self, index: int, pid: int) -> dict[str, Any] | None:
        """What /proc would say of a simulated process (None: not a simulated one)."""
        gpu = self.gpus[index]
        load = gpu.processes
        return None if load is None else load.identity(pid, self._seconds(gpu,
                                                                          gpu.clock_ns()))

    def wattlab_simulated_truth(self, index: int, t0_ns: int, t1_ns: int
                                ) -> dict[str, Any] | None:
        """The physics' idle, static and per-process energy over a window (None: unshared)."""
        gpu = self.gpus[index]
        return None if gpu.processes is None else gpu.processes.truth(gpu, t0_ns, t1_ns)
