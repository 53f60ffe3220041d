"""An object shaped like the ``pynvml`` module, answering from simulated GPUs.

Why: the NVML driver takes "the library" as an argument, so on a machine without a GPU it can
be handed this instead of ``pynvml`` and run unchanged. Function names, argument order,
return types (pynvml's own ctypes structures where pynvml returns them), units (mW, mJ, MHz,
unix µs) and errors (``pynvml.NVMLError(code)``, which maps to the same subclasses) follow
nvidia-ml-py; this file was written from its interface, not from our driver.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import pynvml

from wattlab.hardware.fake_nvml_processes import FakeMigHandle, FakeNvmlProcesses
from wattlab.hardware.fake_nvml_setters import FakeNvmlSetters
from wattlab.hardware.simulated_gpu import SimulatedGpu


class FakeHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns: opaque to the caller."""

    def __init__(self, owner: FakeNvml, index: int) -> None:
        self.owner = owner
        self.index = index

    def __repr__(self) -> str:
        return f"<FakeHandle GPU {self.index}>"


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _pointee(arg: Any) -> Any:
    """What a C argument points at.

    pynvml passes ``byref(x)``, wattlab ``pointer(x)`` or an array itself (a C array
    argument is its first element's address).
    """
    if type(arg).__name__ == "CArgObject":  # ctypes.byref's result: the object is _obj
        return arg._obj
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    return arg


def _fill_samples(out: Any, stamps_us: Any, power_mw: Any) -> None:
    """Write (unix µs, mW) pairs into an array of ``nvmlSample_t``."""
    for i, (ts, mw) in enumerate(zip(stamps_us.tolist(), power_mw.tolist(), strict=True)):
        out[i].timeStamp = ts
        out[i].sampleValue.uiVal = mw


class FakeNvml(FakeNvmlSetters, FakeNvmlProcesses):
    """The subset of the pynvml API wattlab uses, backed by ``SimulatedGpu`` objects.

    ``init_error`` (an ``NVML_ERROR_*`` code) makes ``nvmlInit`` fail, e.g. to test a machine
    without the NVIDIA driver; ``process_query_error`` makes the per-process calls fail.
    Calls before ``nvmlInit`` fail with UNINITIALIZED, as in NVML.
    """

    def __init__(
        self,
        gpus: Sequence[SimulatedGpu],
        driver_version: str = "580.159.04",
        nvml_version: str = "13.580.159.04",
        init_error: int | None = None,
        process_query_error: int | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.process_query_error = process_query_error
        self.driver_version = driver_version
        self.nvml_version = nvml_version
        self.init_error = init_error
        self.init_count = 0
        self.calls: set[str] = set()  # which calls were made (a set: flat over hours)

    # ------------------------------------------------------------------ library

    def nvmlInit(self) -> None:
        """Start the library (counted, like NVML)."""
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        """Start the library; ``init_error`` simulates a machine without the driver."""
        self.calls.add("nvmlInit")
        if self.init_error is not None:
            raise _err(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        """Stop the library (one per successful init)."""
        self._check_init("nvmlShutdown")
        self.init_count -= 1

    def _check_init(self, name: str) -> None:
        self.calls.add(name)
        if self.init_count <= 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any, name: str) -> SimulatedGpu:
        self._check_init(name)
        if isinstance(handle, FakeMigHandle):  # a MIG device answers only the MIG calls
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not isinstance(handle, FakeHandle) or handle.owner is not self:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if not gpu.supports(name):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlSystemGetDriverVersion(self) -> str:
        """Driver version string, e.g. "580.159.04"."""
        self._check_init("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        """NVML version string."""
        self._check_init("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def nvmlDeviceGetCount(self) -> int:
        """Number of GPUs."""
        self._check_init("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        """Handle of GPU ``index``; INVALID_ARGUMENT when there is none."""
        self._check_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(self, index)

    # ------------------------------------------------------------------ identity

    def nvmlDeviceGetName(self, handle: Any) -> str:
        """Product name (a MIG device's: the GPU's, " MIG " and its profile)."""
        if isinstance(handle, FakeMigHandle):
            self._check_init("nvmlDeviceGetName")
            return self.mig_device_name(handle)
        return self._gpu(handle, "nvmlDeviceGetName").model.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        """The UUID, "GPU-" and hex groups."""
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        """Board serial number."""
        return self._gpu(handle, "nvmlDeviceGetSerial").serial

    def nvmlDeviceGetBoardPartNumber(self, handle: Any) -> str:
        """Board part number."""
        return self._gpu(handle, "nvmlDeviceGetBoardPartNumber").board_part_number

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        """[current, pending] MIG mode (``NVML_DEVICE_MIG_ENABLE`` / ``_DISABLE``)."""
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetVirtualizationMode(self, handle: Any) -> int:
        """``NVML_GPU_VIRTUALIZATION_MODE_*``: none, passthrough, a vGPU guest, a vGPU host."""
        return self._gpu(handle, "nvmlDeviceGetVirtualizationMode").virtualization_mode

    # ------------------------------------------------------------------ power

    def _samples_newer(self, handle: Any, sampling_type: int, since_us: int) -> tuple[Any, Any]:
        """(unix µs, mW) of the power samples newer than ``since_us``, oldest first."""
        gpu = self._gpu(handle, "nvmlDeviceGetSamples")
        if sampling_type != pynvml.NVML_TOTAL_POWER_SAMPLES:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        stamps_us, power_mw = gpu.power_samples(gpu.clock_ns())
        keep = stamps_us > since_us
        if not keep.any():
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return stamps_us[keep], power_mw[keep]

    def nvmlDeviceGetSamples(
        self, handle: Any, sampling_type: int, timeStamp: int
    ) -> tuple[int, list[Any]]:
        """Samples strictly newer than ``timeStamp`` (unix µs); NOT_FOUND when there are none."""
        stamps_us, power_mw = self._samples_newer(handle, sampling_type, timeStamp)
        out = (pynvml.c_nvmlSample_t * stamps_us.shape[0])()
        _fill_samples(out, stamps_us, power_mw)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, list(out)

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        """The C entry point ``name``, as pynvml's private lookup hands it out.

        Only those wattlab calls directly; others fail with FUNCTION_NOT_FOUND, as in pynvml.
        """
        self._check_init(name)
        entry = {"nvmlDeviceGetSamples": self._c_get_samples,
                 "nvmlDeviceGetFieldValues": self._c_get_field_values,
                 "nvmlDeviceGetPowerUsage": self._c_get_power_usage}.get(name)
        if entry is None:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return entry

    def _c_get_samples(  # noqa: PLR0917 - the C function's six positional arguments
        self, handle: Any, sampling_type: Any, since_us: Any, value_type: Any, count: Any,
        samples: Any,
    ) -> int:
        """``nvmlDeviceGetSamples`` as C sees it: a return code, pointers for the outputs.

        ``count`` in: the array's length; out: samples written (with no array: available),
        oldest first.
        """
        try:
            stamps_us, power_mw = self._samples_newer(handle, sampling_type.value,
                                                      since_us.value)
        except pynvml.NVMLError as e:
            return int(e.value)
        value_type.contents.value = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        n = stamps_us.shape[0]
        if samples is not None:
            n = min(n, count.contents.value)
            _fill_samples(samples, stamps_us[:n], power_mw[:n])
        count.contents.value = n
        return pynvml.NVML_SUCCESS

    def _c_get_field_values(self, handle: Any, count: Any, values: Any) -> int:
        """``nvmlDeviceGetFieldValues`` as C sees it; the return code is the call's.

        Fills ``values`` (an array of ``nvmlFieldValue_t`` or pynvml's ``byref`` of one) in
        place, each field with its own status in ``nvmlReturn``.
        """
        try:
            gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        except pynvml.NVMLError as e:
            return int(e.value)
        values = _pointee(values)
        now = gpu.clock_ns()
        readers = {
            pynvml.NVML_FI_DEV_POWER_INSTANT: ("NVML_FI_DEV_POWER_INSTANT", gpu.instant_power_mw),
            pynvml.NVML_FI_DEV_POWER_AVERAGE: ("NVML_FI_DEV_POWER_AVERAGE", gpu.average_power_mw),
        }
        for i in range(count if isinstance(count, int) else count.value):
            reader = readers.get(values[i].fieldId)
            module_scope = values[i].scopeId == pynvml.NVML_POWER_SCOPE_MODULE
            if reader is None or not gpu.supports(reader[0]) or (
                    module_scope and not gpu.module_power):
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            values[i].nvmlReturn = pynvml.NVML_SUCCESS
            values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            values[i].value.uiVal = reader[1](now)
            update = gpu.last_update_ns(now)
            values[i].timestamp = int(gpu.to_unix_us(now if update is None else update))
            values[i].latencyUsec = 0
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[Any]) -> Any:
        """Per-field status in ``nvmlReturn`` (no exception), as the real call does.

        The shape of nvidia-ml-py's wrapper: an array of ``c_nvmlFieldValue_t``, a field id
        or a ``(fieldId, scopeId)`` pair each, handed by reference to the C entry point;
        only the call's own failure raises.
        """
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, field_id in enumerate(fieldIds):
            try:
                (values[i].fieldId, values[i].scopeId) = field_id
            except TypeError:
                values[i].fieldId = field_id
        code = self._c_get_field_values(handle, ctypes.c_int32(len(fieldIds)),
                                        ctypes.byref(values))
        if code != pynvml.NVML_SUCCESS:
            raise _err(code)
        return values

    def _c_get_power_usage(self, handle: Any, power_mw: Any) -> int:
        """``nvmlDeviceGetPowerUsage`` as C sees it: mW into ``*power_mw``, a return code."""
        try:
            out = _pointee(power_mw)
            out.value = self.nvmlDeviceGetPowerUsage(handle)
        except pynvml.NVMLError as e:
            return int(e.value)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Power in mW: the 1 s average on Ampere and newer."""
        gpu = self._gpu(handle, "nvmlDeviceGetPowerUsage")
        return gpu.average_power_mw(gpu.clock_ns())

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """Energy in mJ since the driver loaded."""
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption")
        return gpu.energy_mj(gpu.clock_ns())

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        """Current power limit in mW."""
        gpu = self._gpu(handle, "nvmlDeviceGetPowerManagementLimit")
        return round(gpu.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        """[min, max] settable power limit in mW."""
        gpu = self._gpu(handle, "nvmlDeviceGetPowerManagementLimitConstraints")
        lo, hi = gpu.model.power_limit_range_w
        return [round(lo * 1000), round(hi * 1000)]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        """Default power limit in mW."""
        gpu = self._gpu(handle, "nvmlDeviceGetPowerManagementDefaultLimit")
        return round(gpu.model.default_power_limit_w * 1000)

    # ------------------------------------------------------------------ state

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        """Current clock of the given type in MHz."""
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return gpu.sm_clock_mhz(gpu.clock_ns())
        if type == pynvml.NVML_CLOCK_MEM:
            return gpu.mem_clock_mhz
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """Utilisation (``.gpu``, ``.memory`` in %) as pynvml's structure."""
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        gpu_pct, mem_pct = gpu.utilisation_pct(gpu.clock_ns())
        return pynvml.c_nvmlUtilization_t(gpu=gpu_pct, memory=mem_pct)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        """Temperature of the given sensor in degrees C."""
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(gpu.temperature_c(gpu.clock_ns()))

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        """Supported memory clocks in MHz, highest first."""
        gpu = self._gpu(handle, "nvmlDeviceGetSupportedMemoryClocks")
        return sorted(gpu.model.mem_clocks_mhz, reverse=True)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memoryClockMHz: int) -> list[int]:
        """Supported SM clocks (MHz, highest first) at a memory clock."""
        gpu = self._gpu(handle, "nvmlDeviceGetSupportedGraphicsClocks")
        if memoryClockMHz not in gpu.model.mem_clocks_mhz:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return sorted(gpu.model.sm_clocks_mhz, reverse=True)
