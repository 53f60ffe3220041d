"""The 90 ms power read (instant field + 1 s average) through NVML's C entry points.

Why not pynvml's wrappers: the power poll is the reader's most frequent wake-up (11 a
second), and each wrapper builds ctypes objects, looks its C function up under a lock and
checks the code in Python, every call. Here the function pointers, the one-field
``nvmlFieldValue_t`` array and the ``unsigned int`` for the average are made once per GPU
and reused, so a read is two C calls and a few attribute reads. The calls themselves are the
same as before (``nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT)`` and
``nvmlDeviceGetPowerUsage``): the average stays the call that calibration records name, so
no recorded value or calibration key changes.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import pynvml

from wattlab.drivers.nvml_samples import VALUE_MEMBERS, UnknownValueType


class PowerCallError(Exception):
    """One of the two calls failed.

    ``reading`` names which (``instant_power_w`` or ``average_power_w``), ``error`` is NVML's.
    """

    def __init__(self, reading: str, error: Exception) -> None:
        super().__init__(str(error))
        self.reading = reading
        self.error = error


class PowerRead:
    """Instant field and 1 s average of one GPU, in NVML's unit (mW), two C calls a read.

    ``lib`` is the ``pynvml`` module (or an object shaped like it) after ``nvmlInit``.
    Thread-safe: the output structures are shared.
    """

    def __init__(self, lib: Any, handle: Any) -> None:
        self._handle = handle
        self._fields_fn = lib._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        self._usage_fn = lib._nvmlGetFunctionPointer("nvmlDeviceGetPowerUsage")
        self._lock = threading.Lock()
        self._one = ctypes.c_int32(1)
        self._field = (pynvml.c_nvmlFieldValue_t * 1)()
        self._usage_mw = ctypes.c_uint()
        self._usage_ptr = ctypes.pointer(self._usage_mw)

    def read(self) -> tuple[float | None, int, float]:
        """(instant mW or None, the field's NVML status, average mW).

        The field's own status (NOT_SUPPORTED on GPUs without it) is returned, not raised,
        as ``nvmlDeviceGetFieldValues`` reports it per field. A failed call, or a value type
        this build does not know, raises ``PowerCallError`` naming the reading.
        """
        with self._lock:
            field = self._field[0]
            field.fieldId = pynvml.NVML_FI_DEV_POWER_INSTANT
            field.scopeId = 0
            code = self._fields_fn(self._handle, self._one, self._field)
            if code != pynvml.NVML_SUCCESS:
                raise PowerCallError("instant_power_w", pynvml.NVMLError(code))
            status = field.nvmlReturn
            instant_mw = None
            if status == pynvml.NVML_SUCCESS:
                member = VALUE_MEMBERS.get(field.valueType)
                if member is None:
                    raise PowerCallError("instant_power_w", UnknownValueType(
                        f"NVML returned unknown value type {field.valueType}"))
                instant_mw = float(getattr(field.value, member))
            code = self._usage_fn(self._handle, self._usage_ptr)
            if code != pynvml.NVML_SUCCESS:
                raise PowerCallError("average_power_w", pynvml.NVMLError(code))
            return instant_mw, status, float(self._usage_mw.value)
