"""Draining NVML's sample buffers: power with one call into a kept array; processes.

pynvml's ``nvmlDeviceGetSamples`` calls NVML twice a drain (once for the count, once for the
samples) and builds a Python object for every sample. NVML fills as many samples as the
array it is handed holds and says how many it wrote, so one call into an array larger than
the driver's buffer (about 120 samples: 2.38 s at 50 Hz on an H100) is enough, and numpy
reads the array where it lies. On an H200 the count query costs only 2-5 µs; the saving is
the per-sample Python (~70 µs a drain), from the reader's largest cost.

The per-process utilisation samples (``process_samples``) and the processes holding memory
(``running_memory``) are read through pynvml's own wrappers: a few processes a read, once
every 0.9 s, where the wrapper's two calls cost microseconds.
"""

from __future__ import annotations

import ctypes
import threading
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
