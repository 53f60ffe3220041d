"""The per-process calls of the pynvml API on simulated GPUs, as nvidia-ml-py answers them.

Why apart from ``FakeNvml``: its reading API is the rest of ``fake_nvml.py``; these answer
from the processes sharing a simulated GPU (``shared_gpu.py``), and ``process_query_error``
(an ``NVML_ERROR_*`` code, settable mid-run) makes them refuse, as an old driver, a vGPU or
a GPU without permission does. ``wattlab_process_identity`` and ``wattlab_simulated_truth``
are no NVML calls: they tell the reader what /proc and the physics would say of a
simulated process, which no real library has.

Under MIG (a ``MigLoad``) they answer as an H100's driver does: the per-process
utilisation is NOT_SUPPORTED, the running processes carry their GPU instance, the MIG
device handles answer only MIG calls (power and utilisation on one: NOT_SUPPORTED), and
each instance's activity comes from GPM samples (``nvmlGpmMigSampleGet``, then
``nvmlGpmMetricsGet`` over two of them).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

from wattlab.hardware.shared_gpu import MigInstance, MigLoad
from wattlab.hardware.simulated_gpu import SimulatedGpu

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a GPU without MIG
MAX_MIG_DEVICES = 7  # nvmlDeviceGetMaxMigDeviceCount of an H100
GPM_METRICS = {pynvml.NVML_GPM_METRIC_SM_UTIL: 0, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 1}


@dataclass(frozen=True)
class FakeMigHandle:
    """What ``nvmlDeviceGetMigDeviceHandleByIndex`` returns: one MIG device of a GPU."""

    index: int  # the parent GPU's
    instance: MigInstance


class FakeNvmlProcesses:
    """Mixed into ``FakeNvml``, which gives ``_gpu`` (the handle's GPU, init checked)."""

    gpus: list[SimulatedGpu]
    process_query_error: int | None = None

    def _gpu(self, handle: Any, name: str) -> SimulatedGpu:
        raise NotImplementedError  # FakeNvml's

    def _check_init(self, name: str) -> None:
        raise NotImplementedError  # FakeNvml's

    def _process_gpu(self, handle: Any, name: str) -> SimulatedGpu:
        gpu = self._gpu(handle, name)
        if self.process_query_error is not None:
            raise pynvml.NVMLError(self.process_query_error)
        if isinstance(gpu.processes, MigLoad) and name == "nvmlDeviceGetProcessUtilization":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
        mig = load.instance_of if isinstance(load, MigLoad) else {}
        return [pynvml.nvmlFriendlyObject({
            "pid": p.pid, "usedGpuMemory": p.used_memory_b,
            "gpuInstanceId": mig.get(p.pid, NO_INSTANCE),
            "computeInstanceId": 0 if p.pid in mig else NO_INSTANCE})
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

    # ------------------------------------------------------------------ MIG and GPM

    def _mig(self, handle: Any, name: str) -> tuple[SimulatedGpu, MigLoad]:
        gpu = self._gpu(handle, name)
        if not isinstance(gpu.processes, MigLoad):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, gpu.processes

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        """How many MIG devices the GPU can have (0: MIG off)."""
        gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return MAX_MIG_DEVICES if isinstance(gpu.processes, MigLoad) else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeMigHandle:
        """The index-th MIG device; NOT_FOUND where the slot holds none."""
        _, load = self._mig(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not 0 <= index < len(load.instances):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeMigHandle(handle.index, load.instances[index])

    def _mig_device(self, handle: Any, name: str) -> FakeMigHandle:
        self._check_init(name)
        if not isinstance(handle, FakeMigHandle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig_device(handle, "nvmlDeviceGetGpuInstanceId").instance.gi

    def mig_device_name(self, handle: FakeMigHandle) -> str:
        """A MIG device's name: the GPU's, " MIG " and the profile (as nvidia-smi lists it)."""
        return f"{self.gpus[handle.index].model.name} MIG {handle.instance.profile}"

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        """A MIG device's SMs, slices and memory (``c_nvmlDeviceAttributes``)."""
        inst = self._mig_device(handle, "nvmlDeviceGetAttributes").instance
        out = pynvml.c_nvmlDeviceAttributes()
        out.multiprocessorCount = inst.sm_count
        out.gpuInstanceSliceCount = out.computeInstanceSliceCount = inst.slices
        out.memorySizeMB = int(inst.profile.split(".")[1].removesuffix("gb")) * 1024
        return out

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmQueryDeviceSupport")
        out = pynvml.c_nvmlGpmSupport_t()
        out.version = pynvml.NVML_GPM_SUPPORT_VERSION
        out.isSupportedDevice = int(gpu.supports("nvmlGpmMigSampleGet"))
        return out

    def nvmlGpmSampleAlloc(self) -> Any:
        """An opaque sample, as pynvml's pointer; what it holds is kept by its address."""
        self._check_init("nvmlGpmSampleAlloc")
        sample = ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())
        self._gpm_samples()[ctypes.addressof(sample.contents)] = (sample, None)
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        if self._gpm_samples().pop(ctypes.addressof(gpmSample.contents), None) is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmMigSampleGet(self, handle: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        gpu, load = self._mig(handle, "nvmlGpmMigSampleGet")
        if gpuInstanceId not in {i.gi for i in load.instances}:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        key = ctypes.addressof(gpmSample.contents)
        if key not in self._gpm_samples():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_samples()[key] = (gpmSample, (handle.index, gpuInstanceId, gpu.clock_ns()))
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        """SM and DRAM-bandwidth utilisation between two samples of one instance.

        The other metrics are NOT_SUPPORTED each (``nvmlReturn`` per metric, as NVML does).
        """
        self._check_init("nvmlGpmMetricsGet")
        held = self._gpm_samples()
        first, second = (held.get(ctypes.addressof(s.contents), (None, None))[1]
                         for s in (metricsGet.sample1, metricsGet.sample2))
        if first is None or second is None or first[:2] != second[:2] or second[2] <= first[2]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        (index, gi, t0_ns), t1_ns = first, second[2]
        gpu = self.gpus[index]
        load = gpu.processes
        assert isinstance(load, MigLoad)
        values = load.instance_activity(self._seconds(gpu, t0_ns), self._seconds(gpu, t1_ns))[gi]
        for i in range(metricsGet.numMetrics):
            m = metricsGet.metrics[i]
            column = GPM_METRICS.get(m.metricId)
            m.nvmlReturn = pynvml.NVML_SUCCESS if column is not None else (
                pynvml.NVML_ERROR_NOT_SUPPORTED)
            m.value = values[column] if column is not None else 0.0
        return metricsGet

    def _gpm_samples(self) -> dict[int, tuple[Any, tuple[int, int, int] | None]]:
        if not hasattr(self, "_gpm"):
            self._gpm: dict[int, tuple[Any, tuple[int, int, int] | None]] = {}
        return self._gpm
