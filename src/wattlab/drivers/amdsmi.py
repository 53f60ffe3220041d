"""AMD GPUs through the ``amdsmi`` package: power, energy counter, clocks and limits in SI units.

Why a driver shaped like ``NvmlDriver``: the GPU reader (``NvmlAcquirer``) then reads an AMD
GPU unchanged, with the same streams (``amd{i}.power``, ``amd{i}.energy``, ``amd{i}.state``),
and the node report counts it as a GPU. It takes "the library" as an argument: the
``amdsmi`` module (ROCm's Python binding, which loads ``libamd_smi``) on an AMD machine,
``wattlab.hardware.fake_amdsmi.FakeAmdSmi`` anywhere else. The API followed is amdsmi's as
shipped with ROCm 6.2-6.4 (``amdsmi_get_energy_count`` answers ``energy_accumulator``; ROCm
6.0 and 6.1 called the same count ``power``, which is read too).

What AMD's readings are known to do, and what is done about it:

- The energy accumulator counts in units of ``counter_resolution`` µJ (15.3 µJ on MI200 and
  MI300). It is 64-bit, but some firmware wraps it at 32 bits: 65.5 kJ, about 90 s at
  750 W. A count below the previous one is unwrapped (+2³² units), and the reader never
  waits longer than a quarter of the shortest wrap at the GPU's top power cap between two
  reads (``energy_interval_cap_s``).
- ``average_socket_power`` is a 1 s average on MI300 (and absent, "N/A", on some parts);
  ``current_socket_power`` is absent before MI300. Both are whole watts.
- On MI300A (an APU) socket power covers the CPU cores, the GPU and the HBM together:
  the scope says so, so the node report does not add RAPL's CPU on top.
- There is no sample buffer: ``read_samples`` returns nothing and power is polled.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.drivers.gpu_index import SharedSession, resolve_indices
from wattlab.drivers.gpu_scope import GpuScope
from wattlab.drivers.nvml import DeviceInfo
from wattlab.errors import NvmlError, NvmlMissingError

NO_LIBRARY_MESSAGE = (
    "amdsmi is not available: pip install amdsmi; needs ROCm's libamd_smi (the amdgpu "
    "driver and ROCm installed); use --simulate to run without an AMD GPU"
)
NOT_SUPPORTED = 2  # AMDSMI_STATUS_NOT_SUPPORTED
NOT_AVAILABLE = "N/A"  # what amdsmi's Python layer puts in a dict for an unsupported value
WRAP_32_UNITS = 2**32
DEFAULT_RESOLUTION_UJ = 15.259  # 2⁻¹⁶ J, the unit of MI200 and MI300 firmware

AMDSMI_CALLS: dict[str, str] = {
    "samples_power_w": "none: amdsmi has no power sample buffer",
    "instant_power_w": "amdsmi_get_power_info()['current_socket_power']",
    "average_power_w": "amdsmi_get_power_info()['average_socket_power']",
    "energy_j": "amdsmi_get_energy_count(): energy_accumulator × counter_resolution",
    "sm_clock_hz": "amdsmi_get_clk_freq(AmdSmiClkType.GFX)",
    "mem_clock_hz": "amdsmi_get_clk_freq(AmdSmiClkType.MEM)",
    "gpu_util_pct": "amdsmi_get_gpu_activity()['gfx_activity']",
    "temperature_c": "amdsmi_get_temp_metric(HOTSPOT, CURRENT)",
    "power_limit_w": "amdsmi_get_power_cap_info()['power_cap']",
}

PLAUSIBLE_PCT = 5.0  # counter vs integrated power: beyond this (and the edges' ±) it warns
CAVEATS = (
    "socket power is in whole watts; average_socket_power is a 1 s average on MI300, "
    "current_socket_power is missing before MI300",
    "on an APU (MI300A) socket power covers the CPU cores, the GPU and the HBM together",
    "the energy accumulator counts in units of counter_resolution (~15.3 uJ) and some "
    "firmware wraps it at 32 bits",
)

# Parts whose socket power covers a CPU too (APUs): the node report must not add RAPL.
APU_NAMES = ("MI300A",)


def load_amdsmi() -> Any:
    """The ``amdsmi`` module, or the error that says how to get it."""
    try:
        return importlib.import_module("amdsmi")
    except (ImportError, OSError) as e:  # OSError: the package is there, libamd_smi is not
        raise NvmlMissingError(f"{NO_LIBRARY_MESSAGE} ({e})") from e


def _number(value: Any) -> float | None:
    """A value amdsmi answered, as a float; None for one it answers "N/A"."""
    return None if value is None or value == NOT_AVAILABLE else float(value)


class AmdSmiDriver(SharedSession):
    """One amdsmi session for every AMD GPU of a host; the reader's GPU-driver interface."""

    kind = "amdsmi"
    prefix = "amd"
    calls = AMDSMI_CALLS
    state_names = ("sm_clock_hz", "mem_clock_hz", "gpu_util_pct", "temperature_c",
                   "power_limit_w")

    def __init__(self, lib: Any = None) -> None:
        self._lib = lib
        self._opened = 0
        self._handles: list[Any] | None = None
        self._lock = threading.Lock()
        self._last_units: dict[int, int] = {}  # last raw accumulator count per GPU
        self._offset_units: dict[int, int] = {}  # units added by wraps and resets, per GPU
        self.wraps_seen = 0

    @property
    def lib(self) -> Any:
        """The amdsmi binding in use (imported on first use unless one was given)."""
        if self._lib is None:
            self._lib = load_amdsmi()
        return self._lib

    def _errors(self) -> tuple[type[BaseException], ...]:
        base = getattr(self.lib, "AmdSmiException", None)
        return (base,) if isinstance(base, type) else (Exception,)

    def _not_supported(self, e: BaseException) -> bool:
        return getattr(e, "err_code", None) == NOT_SUPPORTED

    def _call(self, gpu: int | None, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call amdsmi, turning its error into one naming the GPU and the call."""
        try:
            return fn(*args)
        except self._errors() as e:
            where = "amdsmi" if gpu is None else f"AMD GPU {gpu}"
            raise NvmlError(f"{where}: {what} failed: {e}") from e

    # ------------------------------------------------------------------ session

    def _start(self) -> None:
        """Initialise amdsmi for AMD GPUs."""
        lib = self.lib
        flags = getattr(getattr(lib, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
        try:
            lib.amdsmi_init() if flags is None else lib.amdsmi_init(flags)
        except self._errors() as e:
            raise NvmlMissingError(f"{NO_LIBRARY_MESSAGE} (amdsmi_init: {e})") from e

    def _stop(self) -> None:
        self._handles = None
        self._call(None, "amdsmi_shut_down", self.lib.amdsmi_shut_down)

    def __enter__(self) -> AmdSmiDriver:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _all_handles(self) -> list[Any]:
        if self._handles is None:
            self._handles = list(self._call(None, "amdsmi_get_processor_handles",
                                            self.lib.amdsmi_get_processor_handles))
        return self._handles

    def gpu_count(self) -> int:
        """Number of AMD GPUs amdsmi sees."""
        return len(self._all_handles())

    def handle(self, gpu: int) -> Any:
        """The processor handle of GPU ``gpu`` (amdsmi's order)."""
        handles = self._all_handles()
        if not 0 <= gpu < len(handles):
            raise NvmlError(f"AMD GPU {gpu}: no such GPU (amdsmi sees {len(handles)})")
        return handles[gpu]

    def resolve_gpus(self, spec: str) -> list[int]:
        """Turn "all" or "0,2" into GPU indices, checking each exists."""
        return resolve_indices(spec, self.gpu_count(), "amdsmi")

    # ------------------------------------------------------------------ identity

    def _ask(self, gpu: int, item: str, fn: Callable[..., Any], *args: Any,
             missing: dict[str, str] | None = None) -> Any:
        """A value, or None where the GPU does not support it (noted in ``missing``)."""
        try:
            return fn(*args)
        except self._errors() as e:
            if not self._not_supported(e):
                raise NvmlError(f"AMD GPU {gpu}: reading {item} failed: {e}") from e
            if missing is not None:
                missing[item] = str(e)
            return None

    def device_info(self, gpu: int) -> DeviceInfo:
        """Name, UUID, serial, driver and power-cap range; unsupported items go to ``missing``."""
        lib, h = self.lib, self.handle(gpu)
        info = DeviceInfo(index=gpu)
        asic = self._ask(gpu, "asic_info", lib.amdsmi_get_gpu_asic_info, h,
                         missing=info.missing) or {}
        info.name = str(asic.get("market_name") or "AMD GPU")
        serial = asic.get("asic_serial")
        info.serial = "" if serial in (None, NOT_AVAILABLE) else str(serial)
        info.uuid = str(self._ask(gpu, "uuid", lib.amdsmi_get_gpu_device_uuid, h,
                                  missing=info.missing) or "")
        driver = self._ask(gpu, "driver_version", lib.amdsmi_get_gpu_driver_info, h,
                           missing=info.missing) or {}
        info.driver_version = str(driver.get("driver_version", ""))
        info.nvml_version = f"amdsmi {getattr(lib, '__version__', '')}".strip()
        cap = self._ask(gpu, "power_cap", lib.amdsmi_get_power_cap_info, h,
                        missing=info.missing) or {}

        def watts(key: str) -> float | None:
            value = _number(cap.get(key))
            return None if value is None else value / 1e6  # µW

        info.power_limit_min_w, info.power_limit_max_w = watts("min_power_cap"), \
            watts("max_power_cap")
        info.power_limit_default_w = watts("default_power_cap")
        info.power_limit_w = watts("power_cap")
        for attr, clk in (("sm_clocks_mhz", "GFX"), ("mem_clocks_mhz", "MEM")):
            freq = self._ask(gpu, f"{clk.lower()}_clocks", lib.amdsmi_get_clk_freq, h,
                             getattr(lib.AmdSmiClkType, clk), missing=info.missing) or {}
            setattr(info, attr, sorted((round(f / 1e6) for f in freq.get("frequency", [])),
                                       reverse=True))
        return info

    def probe(self, gpu: int) -> dict[str, str]:
        """Which readings this GPU lacks: {reading name: why}, each tried once."""
        missing = {"samples_power_w": "amdsmi has no power sample buffer"}
        power = self._call(gpu, "amdsmi_get_power_info", self.lib.amdsmi_get_power_info,
                           self.handle(gpu))
        for name, key in (("instant_power_w", "current_socket_power"),
                          ("average_power_w", "average_socket_power")):
            if _number(power.get(key)) is None:
                missing[name] = f"amdsmi_get_power_info answers {key} = N/A"
        self._ask(gpu, "energy_j", self.read_energy_j, gpu, missing=missing)
        state = self.read_state(gpu)
        missing.update({n: "not supported by this GPU" for n in self.state_names
                        if n not in state})
        return missing

    def scope(self, gpu: int, name: str) -> GpuScope:
        """What socket power covers: the GPU board, or on an APU the whole package."""
        apu = any(tag in name.upper() for tag in APU_NAMES)
        return GpuScope(module=apu, module_parts=(
            "the whole APU socket: CPU cores, GPU and HBM (socket power); not the GPU alone"
            if apu else ""))

    # ------------------------------------------------------------------ readings

    def read_samples(self, gpu: int, last_seen_us: int
                     ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Amdsmi keeps no sample buffer: always empty (power is polled instead)."""
        return np.zeros(0, np.int64), np.zeros(0, np.float64)

    def read_power(self, gpu: int) -> tuple[float | None, float | None]:
        """(current socket W, 1 s average socket W); None for what the GPU answers N/A."""
        power = self._call(gpu, AMDSMI_CALLS["average_power_w"],
                           self.lib.amdsmi_get_power_info, self.handle(gpu))
        return (_number(power.get("current_socket_power")),
                _number(power.get("average_socket_power")))

    def read_energy_j(self, gpu: int) -> float:
        """The accumulator in J, unwrapped where the firmware wraps it at 32 bits."""
        count = self._call(gpu, AMDSMI_CALLS["energy_j"], self.lib.amdsmi_get_energy_count,
                           self.handle(gpu))
        value = _number(count.get("energy_accumulator", count.get("power")))  # "power" < 6.2
        if value is None:
            raise NvmlError(f"AMD GPU {gpu}: amdsmi_get_energy_count answered no count")
        units = int(value)
        resolution_uj = float(count.get("counter_resolution") or DEFAULT_RESOLUTION_UJ)
        last = self._last_units.get(gpu)
        if last is not None and units < last:
            # below 2³²: the firmware wrapped at 32 bits; above, a 64-bit count never wraps, so
            # the counter was reset (driver reload): carry on from the last count
            self._offset_units[gpu] = self._offset_units.get(gpu, 0) + (
                WRAP_32_UNITS if last < WRAP_32_UNITS else last)
            self.wraps_seen += 1
        self._last_units[gpu] = units
        return (units + self._offset_units.get(gpu, 0)) * resolution_uj * 1e-6

    def energy_interval_cap_s(self, gpu: int) -> float | None:
        """A quarter of the time a 32-bit accumulator takes to wrap at the top power cap."""
        cap = self._ask(gpu, "power_cap", self.lib.amdsmi_get_power_cap_info,
                        self.handle(gpu)) or {}
        top = _number(cap.get("max_power_cap"))
        top_w = top / 1e6 if top is not None and top > 0 else 1000.0
        return WRAP_32_UNITS * DEFAULT_RESOLUTION_UJ * 1e-6 / top_w / 4

    def counter_config(self, gpu: int) -> dict[str, Any]:
        """What the descriptor says about this GPU's counter and the checks made on it."""
        count = self._ask(gpu, "energy_j", self.lib.amdsmi_get_energy_count,
                          self.handle(gpu)) or {}
        resolution_uj = float(count.get("counter_resolution") or DEFAULT_RESOLUTION_UJ)
        return {
            "energy_counter": {
                "resolution_uj": resolution_uj,
                "wrap": f"64-bit, but some firmware wraps at 32 bits ({WRAP_32_UNITS} units "
                        f"= {WRAP_32_UNITS * resolution_uj * 1e-9:.1f} kJ): a count below the "
                        "previous one is unwrapped",
                "plausible_pct": PLAUSIBLE_PCT,
                "plausibility": f"wattlab energy --node compares the counter with the "
                                f"integrated socket power and warns beyond "
                                f"{PLAUSIBLE_PCT:g} % (plus both estimates' ±)",
            },
            "caveats": list(CAVEATS),
        }

    def read_state(self, gpu: int) -> dict[str, float]:
        """Clocks (Hz), activity (%), hotspot temperature (C), power cap (W); N/A omitted."""
        lib, h = self.lib, self.handle(gpu)
        out: dict[str, float] = {}
        for name, clk in (("sm_clock_hz", "GFX"), ("mem_clock_hz", "MEM")):
            freq = self._ask(gpu, name, lib.amdsmi_get_clk_freq, h, getattr(lib.AmdSmiClkType, clk))
            if freq and freq.get("frequency"):
                out[name] = float(freq["frequency"][int(freq["current"])])  # Hz
        activity = self._ask(gpu, "gpu_util_pct", lib.amdsmi_get_gpu_activity, h) or {}
        if (util := _number(activity.get("gfx_activity"))) is not None:
            out["gpu_util_pct"] = util
        temp = self._ask(gpu, "temperature_c", lib.amdsmi_get_temp_metric, h,
                         lib.AmdSmiTemperatureType.HOTSPOT, lib.AmdSmiTemperatureMetric.CURRENT)
        if (temp_c := _number(temp)) is not None:
            out["temperature_c"] = temp_c
        cap = self._ask(gpu, "power_limit_w", lib.amdsmi_get_power_cap_info, h) or {}
        if (cap_uw := _number(cap.get("power_cap"))) is not None:
            out["power_limit_w"] = cap_uw / 1e6
        return out
