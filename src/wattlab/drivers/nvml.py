"""NVML driver: the GPU's own power, energy and state readings, converted to SI units.

Why a driver around pynvml: it takes the library as an argument (the ``pynvml`` module, or
``wattlab.hardware.fake_nvml.FakeNvml`` on a machine without a GPU), turns NVML's mW / mJ /
MHz / unix-µs into W / J / Hz, turns ``NVMLError`` into ``NvmlError`` naming the GPU and the
call, and records which NVML call each value comes from (``NVML_CALLS``) so a run file says
exactly what was measured. Fields a GPU does not support are reported as missing, never as 0.

Safety: the setters change a real GPU's power limit or clocks (root only). wattlab calls them
only from explicit commands (``sweep``, ``tune``) that restore the previous setting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import pynvml  # the pure-Python binding; the C library is only loaded by nvmlInit

from wattlab.drivers.gpu_index import SharedSession, resolve_indices
from wattlab.drivers.gpu_scope import GpuScope
from wattlab.drivers.nvml_identity import (
    DeviceInfo,
    is_not_supported,
    read_clock_pairs,
    read_device_info,
    read_scope,
)
from wattlab.drivers.nvml_power import PowerCallError, PowerRead
from wattlab.drivers.nvml_samples import (
    VALUE_MEMBERS,
    ProcessSample,
    SampleDrain,
    UnknownValueType,
    process_samples,
    running_memory,
)
from wattlab.errors import NvmlError, NvmlMissingError, UsageError

NO_LIBRARY_MESSAGE = (
    "NVML library not found: is the NVIDIA driver installed? use --simulate to run without a GPU"
)

# Where every value comes from, by the name it has in wattlab (stored in descriptors).
NVML_CALLS: dict[str, str] = {
    "samples_power_w": "nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)",
    "instant_power_w": "nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT)",
    "average_power_w": "nvmlDeviceGetPowerUsage",
    "energy_j": "nvmlDeviceGetTotalEnergyConsumption",
    "sm_clock_hz": "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
    "mem_clock_hz": "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)",
    "gpu_util_pct": "nvmlDeviceGetUtilizationRates().gpu",
    "temperature_c": "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
    "power_limit_w": "nvmlDeviceGetPowerManagementLimit",
    "processes": "nvmlDeviceGetProcessUtilization",
    "process_memory": "nvmlDeviceGetComputeRunningProcesses(+GraphicsRunningProcesses)",
}
# a GPU answering these to the per-process calls has no per-process stream (old driver, vGPU)
PROCESS_REFUSALS = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION,
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

# State readings as data: (name, NVML reader, factor to SI units).
StateReader = Callable[[Any, Any], float]
STATE_READINGS: tuple[tuple[str, StateReader, float], ...] = (
    ("sm_clock_hz", lambda lib, h: lib.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), 1e6),
    ("mem_clock_hz", lambda lib, h: lib.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM), 1e6),
    ("gpu_util_pct", lambda lib, h: lib.nvmlDeviceGetUtilizationRates(h).gpu, 1.0),
    (
        "temperature_c",
        lambda lib, h: lib.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        1.0,
    ),
    ("power_limit_w", lambda lib, h: lib.nvmlDeviceGetPowerManagementLimit(h) / 1e3, 1.0),
)

_NO_LIBRARY_CODES = (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)


def nvml_value(value: Any, value_type: int) -> float:
    """Read an ``nvmlValue_t`` union by its declared type (power fields are ``uiVal`` mW)."""
    member = VALUE_MEMBERS.get(value_type)
    if member is None:
        raise NvmlError(f"NVML returned unknown value type {value_type}")
    return float(getattr(value, member))


class NvmlDriver(SharedSession):
    """One NVML session (shared by every GPU of a host); all readings in SI units.

    ``kind``, ``prefix``, ``calls`` and ``state_names`` are what the GPU reader
    (``NvmlAcquirer``) asks of any GPU driver: the amdsmi driver answers them too.
    """

    kind = "nvml"  # the descriptors' kind and transport
    prefix = "gpu"  # streams gpu{i}.samples, gpu{i}.power, ...
    calls = NVML_CALLS
    state_names = tuple(name for name, _, _ in STATE_READINGS)

    def __init__(self, lib: Any = None) -> None:
        self._lib = lib
        self._opened = 0
        self._handles: dict[int, Any] = {}
        self._drains: dict[int, SampleDrain] = {}
        self._power_reads: dict[int, PowerRead] = {}
        self._lock = threading.Lock()

    @property
    def lib(self) -> Any:
        """The NVML binding in use (pynvml unless one was given)."""
        if self._lib is None:
            self._lib = pynvml
        return self._lib

    # ------------------------------------------------------------------ session

    def _start(self) -> None:
        """Initialise NVML."""
        try:
            self.lib.nvmlInit()
        except pynvml.NVMLError as e:
            if getattr(e, "value", None) in _NO_LIBRARY_CODES:
                raise NvmlMissingError(f"{NO_LIBRARY_MESSAGE} ({e})") from e
            raise NvmlError(f"NVML failed to initialise: {e}") from e

    def _stop(self) -> None:
        self._handles.clear()
        self._drains.clear()
        self._power_reads.clear()
        try:
            self.lib.nvmlShutdown()
        except pynvml.NVMLError as e:
            raise NvmlError(f"NVML failed to shut down: {e}") from e

    def __enter__(self) -> NvmlDriver:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, gpu: int | None, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML, turning its error into one naming the GPU and the call."""
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            where = "NVML" if gpu is None else f"GPU {gpu}"
            raise NvmlError(f"{where}: {what} failed: {e}") from e

    def gpu_count(self) -> int:
        """Number of GPUs NVML sees."""
        return int(self._call(None, "nvmlDeviceGetCount", self.lib.nvmlDeviceGetCount))

    def handle(self, gpu: int) -> Any:
        """The NVML handle of a GPU (cached)."""
        with self._lock:
            h = self._handles.get(gpu)
        if h is None:
            h = self._call(gpu, "nvmlDeviceGetHandleByIndex",
                           self.lib.nvmlDeviceGetHandleByIndex, gpu)
            with self._lock:
                self._handles[gpu] = h
        return h

    def resolve_gpus(self, spec: str) -> list[int]:
        """Turn "all" or "0,2" into GPU indices, checking each exists."""
        return resolve_indices(spec, self.gpu_count())

    # ------------------------------------------------------------------ identity

    def device_info(self, gpu: int) -> DeviceInfo:
        """Everything the run file should say about a GPU; unsupported items go to ``missing``."""
        return read_device_info(self.lib, self.handle(gpu), gpu)

    def supported_clock_pairs(self, gpu: int) -> list[tuple[int, int]]:
        """Every supported (SM MHz, memory MHz) pair, highest first; ``NvmlError`` if not."""
        return read_clock_pairs(self.lib, self.handle(gpu), gpu)

    def probe(self, gpu: int) -> dict[str, str]:
        """Which readings this GPU lacks: {reading name: NVML's message}, tried once each."""
        lib, h = self.lib, self.handle(gpu)
        checks: list[tuple[str, Callable[[], Any]]] = [
            ("samples_power_w",
             partial(lib.nvmlDeviceGetSamples, h, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)),
            ("average_power_w", partial(lib.nvmlDeviceGetPowerUsage, h)),
            ("energy_j", partial(lib.nvmlDeviceGetTotalEnergyConsumption, h)),
        ]
        checks += [(name, partial(reader, lib, h)) for name, reader, _ in STATE_READINGS]
        checks.append(("processes", lambda: (process_samples(lib, h, 0), running_memory(lib, h))))
        missing: dict[str, str] = {}
        for name, check in checks:
            try:
                check()
            except pynvml.NVMLError as e:
                code = getattr(e, "value", None)
                if is_not_supported(e) or (name == "processes" and code in PROCESS_REFUSALS):
                    missing[name] = str(e)
                elif not (name == "samples_power_w" and code == pynvml.NVML_ERROR_NOT_FOUND):
                    raise NvmlError(f"GPU {gpu}: {NVML_CALLS[name]} failed: {e}") from e
        status = self._instant_field(gpu)[1]
        if status is not None:
            missing["instant_power_w"] = status
        return missing

    def scope(self, gpu: int, name: str) -> GpuScope:
        """MIG mode, virtualisation mode and module power of a GPU: what its readings cover."""
        return read_scope(self.lib, self.handle(gpu), gpu, name)

    # ------------------------------------------------------------------ readings

    def energy_interval_cap_s(self, gpu: int) -> float | None:
        """NVML's energy counter is 64-bit mJ and never wraps: no cap on the read interval."""
        return None

    def counter_config(self, gpu: int) -> dict[str, Any]:
        """Nothing to add to the descriptor about NVML's counter (mJ, 64-bit, no known wrap)."""
        return {}

    def read_samples(
        self, gpu: int, last_seen_us: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Drain the 50 Hz power buffer: samples strictly newer than ``last_seen_us``.

        Returns (driver timestamps in unix µs, power in W), oldest first. An empty buffer is
        NVML's NOT_FOUND, returned here as empty arrays. One NVML call (``SampleDrain``).
        """
        try:
            stamps, power_mw = self._drain(gpu).read(self.handle(gpu), last_seen_us)
        except (pynvml.NVMLError, UnknownValueType) as e:
            raise NvmlError(f"GPU {gpu}: {NVML_CALLS['samples_power_w']} failed: {e}") from e
        power_w = power_mw / 1e3
        order = np.argsort(stamps, kind="stable")
        stamps, power_w = stamps[order], power_w[order]
        newer = stamps > last_seen_us
        return stamps[newer], power_w[newer]

    def _drain(self, gpu: int) -> SampleDrain:
        """The GPU's sample drain, made on first use.

        Not before ``nvmlInit``: it looks up NVML's C function, which needs the library loaded.
        """
        with self._lock:
            drain = self._drains.get(gpu)
            if drain is None:
                drain = self._drains[gpu] = SampleDrain(self.lib)
            return drain

    def _instant_field(self, gpu: int) -> tuple[float | None, str | None]:
        """(instant power W, None) or (None, why it is missing)."""
        values = self._call(
            gpu,
            NVML_CALLS["instant_power_w"],
            self.lib.nvmlDeviceGetFieldValues,
            self.handle(gpu),
            [pynvml.NVML_FI_DEV_POWER_INSTANT],
        )
        fv = values[0]
        if fv.nvmlReturn != pynvml.NVML_SUCCESS:
            return None, str(pynvml.NVMLError(fv.nvmlReturn))
        return nvml_value(fv.value, fv.valueType) / 1e3, None

    def read_power(self, gpu: int) -> tuple[float | None, float]:
        """(instant W or None where the field is unsupported, 1 s average W).

        The reader's most frequent call: through ``PowerRead`` (C entry points, structures
        kept), not pynvml's wrappers.
        """
        power = self._power_reads.get(gpu)
        if power is None:  # made on first use, after nvmlInit (it looks up C functions)
            power = self._call(gpu, "looking up the power calls", PowerRead, self.lib,
                               self.handle(gpu))
            with self._lock:
                power = self._power_reads.setdefault(gpu, power)
        try:
            instant_mw, _, average_mw = power.read()
        except PowerCallError as e:
            raise NvmlError(f"GPU {gpu}: {NVML_CALLS[e.reading]} failed: {e}") from e
        return None if instant_mw is None else instant_mw / 1e3, average_mw / 1e3

    def read_processes(self, gpu: int, last_seen_us: int, *, shared_from: int = 2
                       ) -> tuple[list[ProcessSample] | None, dict[int, float]]:
        """(utilisation samples newer than ``last_seen_us`` or None, pid -> used memory B).

        None: fewer than ``shared_from`` processes hold the GPU, so the utilisation call
        (~1.9 ms of CPU on an H200; both lists ~75 µs) is not made (docs/processes.md).
        """
        lib, h = self.lib, self.handle(gpu)
        memory_b = self._call(gpu, NVML_CALLS["process_memory"], running_memory, lib, h)
        samples = None if len(memory_b) < shared_from else self._call(
            gpu, NVML_CALLS["processes"], process_samples, lib, h, last_seen_us)
        return samples, memory_b

    def read_energy_j(self, gpu: int) -> float:
        """Energy counter (J since the driver loaded); the call costs ~3 ms on an H100."""
        mj = self._call(gpu, NVML_CALLS["energy_j"],
                        self.lib.nvmlDeviceGetTotalEnergyConsumption, self.handle(gpu))
        return float(mj) / 1e3

    def read_state(self, gpu: int) -> dict[str, float]:
        """Clocks (Hz), utilisation (%), temperature (C), power limit (W); unsupported omitted."""
        h = self.handle(gpu)
        out: dict[str, float] = {}
        for name, reader, factor in STATE_READINGS:
            try:
                out[name] = float(reader(self.lib, h)) * factor
            except pynvml.NVMLError as e:
                if not is_not_supported(e):
                    raise NvmlError(f"GPU {gpu}: {NVML_CALLS[name]} failed: {e}") from e
        return out

    # ------------------------------------------------------------------ setters (root)

    def _set(self, gpu: int, what: str, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(self.handle(gpu), *args)
        except pynvml.NVMLError as e:
            if getattr(e, "value", None) == pynvml.NVML_ERROR_NO_PERMISSION:
                raise NvmlError(f"GPU {gpu}: {what} needs root (NVML: {e})") from e
            raise NvmlError(f"GPU {gpu}: {what} failed: {e}") from e

    def set_power_limit_w(self, gpu: int, limit_w: float) -> None:
        """Set the power limit; checked against the GPU's range first."""
        lo_mw, hi_mw = self._call(
            gpu,
            "nvmlDeviceGetPowerManagementLimitConstraints",
            self.lib.nvmlDeviceGetPowerManagementLimitConstraints,
            self.handle(gpu),
        )
        limit_mw = round(limit_w * 1e3)
        if not lo_mw <= limit_mw <= hi_mw:
            raise UsageError(
                f"GPU {gpu}: power limit {limit_w:g} W is outside its range "
                f"{lo_mw / 1e3:g}-{hi_mw / 1e3:g} W"
            )
        self._set(
            gpu, "setting the power limit", self.lib.nvmlDeviceSetPowerManagementLimit, limit_mw
        )

    def get_power_limit_w(self, gpu: int) -> float:
        """Power limit in force now (W), to restore it after a sweep."""
        mw = self._call(
            gpu,
            NVML_CALLS["power_limit_w"],
            self.lib.nvmlDeviceGetPowerManagementLimit,
            self.handle(gpu),
        )
        return float(mw) / 1e3

    def lock_sm_clocks(self, gpu: int, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock into [min, max] MHz."""
        if min_mhz > max_mhz or min_mhz < 0:
            raise UsageError(f"GPU {gpu}: clock range {min_mhz}-{max_mhz} MHz is not valid")
        self._set(
            gpu,
            "locking the SM clock",
            self.lib.nvmlDeviceSetGpuLockedClocks,
            int(min_mhz),
            int(max_mhz),
        )

    def reset_clocks(self, gpu: int) -> None:
        """Free the SM clock again."""
        self._set(gpu, "resetting the SM clock", self.lib.nvmlDeviceResetGpuLockedClocks)

    def lock_memory_clocks(self, gpu: int, min_mhz: int, max_mhz: int) -> None:
        """Lock the memory clock into [min, max] MHz (``nvmlDeviceSetMemoryLockedClocks``)."""
        if min_mhz > max_mhz or min_mhz < 0:
            raise UsageError(
                f"GPU {gpu}: memory clock range {min_mhz}-{max_mhz} MHz is not valid"
            )
        self._set(
            gpu,
            "locking the memory clock",
            self.lib.nvmlDeviceSetMemoryLockedClocks,
            int(min_mhz),
            int(max_mhz),
        )

    def reset_memory_clocks(self, gpu: int) -> None:
        """Free the memory clock again (``nvmlDeviceResetMemoryLockedClocks``)."""
        self._set(
            gpu, "resetting the memory clock", self.lib.nvmlDeviceResetMemoryLockedClocks
        )
