"""Draining NVML's power sample buffer with one C call into an array kept between drains.

Why: pynvml's ``nvmlDeviceGetSamples`` calls NVML twice (once for the count, once for the
data), allocates a fresh array and copies every sample into a Python object; on an H200 a
drain of ~45 samples cost 0.94 ms of CPU that way, the largest share of the reader's steady
cost after its wake-ups. Here NVML writes straight into an array of ``CAPACITY`` samples
(the driver keeps ~120), which numpy reads in place.

The C function comes from the binding's function-pointer lookup (``_nvmlGetFunctionPointer``,
which every pynvml call uses); a binding without one gets the public call. When NVML answers
INSUFFICIENT_SIZE (a driver keeping more than ``CAPACITY`` samples) the public call is used
for that drain, so nothing is lost either way.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import numpy.typing as npt
import pynvml

from wattlab.errors import NvmlError

CAPACITY = 512

# Where an nvmlValue_t union (8 bytes, little-endian) keeps each declared type.
_VALUE_DTYPES = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "<f8",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "<u4",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "<u8",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "<u8",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "<i8",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "<i4",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "<u2",
}
SAMPLE_BYTES = ctypes.sizeof(pynvml.c_nvmlSample_t)


def sample_dtype(value_type: int) -> np.dtype[Any]:
    """The numpy view of one ``nvmlSample_t`` (u64 stamp, then the union) for a value type."""
    fmt = _VALUE_DTYPES.get(value_type)
    if fmt is None:
        raise NvmlError(f"NVML returned unknown value type {value_type}")
    return np.dtype({"names": ["t_us", "value"], "formats": ["<u8", fmt],
                     "offsets": [0, 8], "itemsize": SAMPLE_BYTES})


class SampleDrain:
    """Power samples newer than a stamp, as (stamps µs, values in NVML units), oldest first.

    Raises ``pynvml.NVMLError`` as the public call does (NOT_FOUND when there are none).
    One per GPU: the array is reused by every drain.
    """

    def __init__(self, lib: Any, capacity: int = CAPACITY) -> None:
        self._lib = lib
        self.capacity = capacity
        self._fn: Any = None
        lookup = getattr(lib, "_nvmlGetFunctionPointer", None)
        if lookup is not None:
            self._fn = lookup("nvmlDeviceGetSamples")
            self._array = (pynvml.c_nvmlSample_t * capacity)()
            self._count = ctypes.c_uint(0)
            self._value_type = ctypes.c_uint(0)

    @property
    def one_call(self) -> bool:
        """Whether drains go straight to the C function (False: the public two-call path)."""
        return self._fn is not None

    def __call__(
        self, handle: Any, last_seen_us: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        if self._fn is None:
            return self._public(handle, last_seen_us)
        self._count.value = self.capacity
        ret = self._fn(handle, ctypes.c_uint(pynvml.NVML_TOTAL_POWER_SAMPLES),
                       ctypes.c_ulonglong(last_seen_us), ctypes.byref(self._value_type),
                       ctypes.byref(self._count), self._array)
        if ret == pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            return self._public(handle, last_seen_us)
        if ret != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        n = min(self._count.value, self.capacity)
        rows = np.frombuffer(self._array, dtype=sample_dtype(self._value_type.value), count=n)
        return rows["t_us"].astype(np.int64), rows["value"].astype(np.float64)

    def _public(
        self, handle: Any, last_seen_us: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        value_type, samples = self._lib.nvmlDeviceGetSamples(
            handle, pynvml.NVML_TOTAL_POWER_SAMPLES, last_seen_us)
        array = (pynvml.c_nvmlSample_t * len(samples))(*samples)
        rows = np.frombuffer(array, dtype=sample_dtype(value_type), count=len(samples))
        return rows["t_us"].astype(np.int64), rows["value"].astype(np.float64)
