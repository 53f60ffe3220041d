"""Draining NVML's sample buffers: power with one call into a kept array; processes.

pynvml's ``nvmlDeviceGetSamples`` calls NVML twice a drain (once for the count, once for the
samples) and builds a Python object for every sample. NVML fills as many samples as the
array it is handed holds and says how many it wrote, so one call into an array larger than
the driver's buffer (about 120 samples: 2.38 s at 50 Hz on an H100) is enough, and numpy
reads the array where it lies. On an H200 the count query costs only 2-5 µs; the saving is
the per-sample Python (~70 µs a drain), from the reader's largest cost.

The per-process utilisation samples (``process_samples``) and the processes holding memory
(``running_memory``) are read through pynvml's own wrappers: a few processes a read, once
every 0.9 s, where the wrapper's two calls cost microseconds. Under MIG the driver gives no
per-process utilisation; each GPU instance's activity comes from GPM (``GpmActivity``).
"""

from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pynvml

VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
"""The ``nvmlValue_t`` union member each NVML value type is read from."""

FIRST_CAPACITY = 256
"""Samples the array holds at first: twice what an H100 driver keeps."""
MAX_CAPACITY = 1 << 16
"""An array this large that still comes back full means NVML is not saying how many."""


def _sample_dtype(member: str) -> np.dtype[Any]:
    """The numpy view of an ``nvmlSample_t`` whose value is the union member ``member``."""
    value_types = dict(pynvml.c_nvmlValue_t._fields_)
    return np.dtype({
        "names": ["stamp_us", "value"],
        "formats": [np.dtype(ctypes.c_ulonglong), np.dtype(value_types[member])],
        "offsets": [pynvml.c_nvmlSample_t.timeStamp.offset,
                    pynvml.c_nvmlSample_t.sampleValue.offset],
        "itemsize": ctypes.sizeof(pynvml.c_nvmlSample_t),
    })


SAMPLE_DTYPES = {value_type: _sample_dtype(member) for value_type, member in VALUE_MEMBERS.items()}


class UnknownValueType(ValueError):
    """NVML declared a value type this build does not know."""


class SampleDrain:
    """``nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)`` for one GPU, one NVML call a drain.

    ``lib`` is the ``pynvml`` module (or an object shaped like it) after ``nvmlInit``: the C
    function comes from its ``_nvmlGetFunctionPointer``. Thread-safe: the array is shared.
    """

    def __init__(self, lib: Any, capacity: int = FIRST_CAPACITY) -> None:
        self._fn = lib._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
        self._lock = threading.Lock()
        self._value_type = ctypes.c_uint()
        self._count = ctypes.c_uint()
        self._value_type_ptr = ctypes.pointer(self._value_type)
        self._count_ptr = ctypes.pointer(self._count)
        self._sampling_type = ctypes.c_uint(pynvml.NVML_TOTAL_POWER_SAMPLES)
        self._samples = (pynvml.c_nvmlSample_t * capacity)()

    @property
    def capacity(self) -> int:
        return len(self._samples)

    def read(self, handle: Any, last_seen_us: int) -> tuple[npt.NDArray[np.int64],
                                                            npt.NDArray[np.float64]]:
        """(unix µs stamps, values in NVML's unit, mW) newer than ``last_seen_us``.

        In NVML's order; empty where NVML has none (its NOT_FOUND). Other failures raise
        ``pynvml.NVMLError``; an undeclared value type raises ``UnknownValueType``.
        """
        with self._lock:
            while True:
                self._count.value = len(self._samples)
                code = self._fn(handle, self._sampling_type, ctypes.c_ulonglong(last_seen_us),
                                self._value_type_ptr, self._count_ptr, self._samples)
                full = code == pynvml.NVML_SUCCESS and self._count.value >= len(self._samples)
                if code == pynvml.NVML_ERROR_INSUFFICIENT_SIZE or full:
                    if len(self._samples) >= MAX_CAPACITY:
                        raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
                    self._samples = (pynvml.c_nvmlSample_t * (2 * len(self._samples)))()
                    continue  # the same request again: nothing was consumed
                if code == pynvml.NVML_ERROR_NOT_FOUND:
                    return np.zeros(0, np.int64), np.zeros(0, np.float64)
                if code != pynvml.NVML_SUCCESS:
                    raise pynvml.NVMLError(code)
                dtype = SAMPLE_DTYPES.get(self._value_type.value)
                if dtype is None:
                    raise UnknownValueType(f"NVML returned unknown value type "
                                           f"{self._value_type.value}")
                rows = np.frombuffer(self._samples, dtype=dtype, count=self._count.value)
                return rows["stamp_us"].astype(np.int64), rows["value"].astype(np.float64)


ProcessSample = tuple[int, int, int, int, int, int]
"""One ``nvmlProcessUtilizationSample_t``: pid, unix µs, SM %, memory %, encoder %, decoder %."""


def process_samples(lib: Any, handle: Any, last_seen_us: int) -> list[ProcessSample]:
    """``nvmlDeviceGetProcessUtilization`` past ``last_seen_us``, oldest first, no duplicates.

    The driver lists only processes active since ``last_seen_us``; none is its NOT_FOUND,
    returned as ``[]`` (as is pynvml's error "Success": its size query answered that nothing
    is to be read). Samples not newer than ``last_seen_us`` and pid 0 (unfilled entries)
    are dropped. Other failures raise ``pynvml.NVMLError``.
    """
    try:
        got = lib.nvmlDeviceGetProcessUtilization(handle, last_seen_us)
    except pynvml.NVMLError as e:
        if getattr(e, "value", None) in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS):
            return []
        raise
    rows = {(int(s.timeStamp), int(s.pid)): (int(s.smUtil), int(s.memUtil), int(s.encUtil),
                                             int(s.decUtil))
            for s in got if int(s.timeStamp) > last_seen_us and int(s.pid) != 0}
    return [(pid, stamp, *util) for (stamp, pid), util in sorted(rows.items())]


def running_memory(lib: Any, handle: Any) -> dict[int, float]:
    """Processes with a context on the GPU (compute, then graphics): pid -> used memory (B).

    NaN where the driver does not say (pynvml's None: ``NVML_VALUE_NOT_AVAILABLE``).
    """
    out: dict[int, float] = {}
    for call in (lib.nvmlDeviceGetComputeRunningProcesses,
                 lib.nvmlDeviceGetGraphicsRunningProcesses):
        for p in call(handle):
            used = p.usedGpuMemory
            out.setdefault(int(p.pid), float("nan") if used is None else float(used))
    return out


@dataclass(frozen=True)
class MigDevice:
    """One GPU instance of a MIG-partitioned GPU: its id, profile, SMs and a device handle."""

    gi: int
    profile: str
    sm_count: int
    slices: int
    handle: Any = field(compare=False, repr=False)


def mig_devices(lib: Any, handle: Any) -> list[MigDevice]:
    """The GPU's instances, by GPU instance id; raises ``pynvml.NVMLError`` on a failing call.

    One handle each: GPM measures the GPU instance, not its compute instances.
    """
    found: dict[int, MigDevice] = {}
    for i in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except pynvml.NVMLError as e:
            if getattr(e, "value", None) == pynvml.NVML_ERROR_NOT_FOUND:
                continue  # an empty slot
            raise
        gi = int(lib.nvmlDeviceGetGpuInstanceId(mig))
        if gi in found:
            continue
        attrs = lib.nvmlDeviceGetAttributes(mig)
        name = lib.nvmlDeviceGetName(mig)
        name = name.decode() if isinstance(name, bytes) else str(name)
        profile = name.rsplit("MIG ", 1)[1] if "MIG " in name else (
            f"{attrs.gpuInstanceSliceCount}g")
        found[gi] = MigDevice(gi, profile, int(attrs.multiprocessorCount),
                              int(attrs.gpuInstanceSliceCount), mig)
    return [found[gi] for gi in sorted(found)]


GPM_METRICS = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)


class GpmActivity:
    """Each GPU instance's SM and DRAM-bandwidth utilisation (%) between consecutive reads.

    GPM measures over the time between two samples of an instance, so the first read only
    takes the samples; every later one answers for the time since the one before. A metric
    NVML does not give is NaN. Raises ``pynvml.NVMLError`` on a failing call.
    """

    def __init__(self, lib: Any, handle: Any, gis: list[int]) -> None:
        self.lib, self.handle = lib, handle
        self._prev: dict[int, Any] = dict.fromkeys(gis)

    def read(self) -> dict[int, tuple[float, float]]:
        out = {}
        for gi, prev in list(self._prev.items()):
            new = self.lib.nvmlGpmSampleAlloc()
            try:
                self.lib.nvmlGpmMigSampleGet(self.handle, gi, new)
            except pynvml.NVMLError:
                self.lib.nvmlGpmSampleFree(new)
                raise
            self._prev[gi] = new
            if prev is None:
                continue
            try:
                out[gi] = self._metrics(prev, new)
            finally:
                self.lib.nvmlGpmSampleFree(prev)
        return out

    def _metrics(self, first: Any, second: Any) -> tuple[float, float]:
        got = pynvml.c_nvmlGpmMetricsGet_t()
        got.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        got.numMetrics = len(GPM_METRICS)
        got.sample1, got.sample2 = first, second
        for i, metric in enumerate(GPM_METRICS):
            got.metrics[i].metricId = metric
        self.lib.nvmlGpmMetricsGet(got)
        sm, dram = (float(got.metrics[i].value)
                    if got.metrics[i].nvmlReturn == pynvml.NVML_SUCCESS else math.nan
                    for i in range(len(GPM_METRICS)))
        return sm, dram

    def close(self) -> None:
        """Free the samples held for the next read."""
        for gi, sample in self._prev.items():
            if sample is not None:
                self.lib.nvmlGpmSampleFree(sample)
            self._prev[gi] = None
