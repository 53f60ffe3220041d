"""An object shaped like the ``amdsmi`` module, answering from simulated GPUs.

Why: the amdsmi driver takes "the library" as an argument, so a machine without an AMD GPU
hands it this and runs it unchanged. Function names, arguments, the dicts returned and
their units follow amdsmi's Python API as shipped with ROCm 6.2-6.4 (socket power in whole
W, the energy accumulator in units of ``counter_resolution`` µJ with a ns timestamp, power
caps in µW, clocks in Hz, "N/A" for a value the part lacks), and errors are
``AmdSmiLibraryException`` with amdsmi's status code. The physics is the simulated GPU's:
``current_socket_power`` is its instant reading, ``average_socket_power`` its 1 s
average (as on MI300), the accumulator its exact energy.

The knobs make the known misbehaviours testable: ``counter_bits=32`` wraps the
accumulator at 2³² units as some firmware does, ``start_units`` puts it near the top,
``counter_scale`` makes it count wrongly (an implausible counter), ``apu=True`` names the
part an MI300A, whose socket power covers its CPU cores too.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu, simulated_gpus

RESOLUTION_UJ = 15.259  # 2⁻¹⁶ J: the unit of MI200 and MI300 firmware
STATUS_INVAL = 1
STATUS_NOT_SUPPORTED = 2
STATUS_NOT_INIT = 32

MI300X = GpuModel(
    name="Simulated AMD Instinct MI300X", idle_w=140.0, dynamic_w=900.0,
    power_limit_range_w=(300.0, 750.0), default_power_limit_w=750.0,
    sm_clocks_mhz=tuple(range(2100, 499, -100)), mem_clocks_mhz=(1300, 900))
MI300A = GpuModel(
    name="Simulated AMD Instinct MI300A", idle_w=120.0, dynamic_w=600.0,
    power_limit_range_w=(300.0, 550.0), default_power_limit_w=550.0,
    sm_clocks_mhz=tuple(range(2100, 499, -100)), mem_clocks_mhz=(1300, 900))


class AmdSmiException(Exception):
    """The base of amdsmi's exceptions."""


class AmdSmiLibraryException(AmdSmiException):
    """A failed library call; ``err_code`` is the ``AMDSMI_STATUS_*`` code."""

    def __init__(self, err_code: int) -> None:
        super().__init__(f"amdsmi status {err_code}")
        self.err_code = err_code


class AmdSmiInitFlags(enum.IntEnum):
    """What amdsmi_init may be asked to start."""

    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1


class AmdSmiClkType(enum.IntEnum):
    """Clock domains (GFX is SYS, as in amdsmi)."""

    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


class AmdSmiTemperatureType(enum.IntEnum):
    """Temperature sensors (MI300 has no EDGE sensor)."""

    EDGE = 0
    HOTSPOT = 1
    VRAM = 2


class AmdSmiTemperatureMetric(enum.IntEnum):
    """Which temperature reading."""

    CURRENT = 0


@dataclass(frozen=True)
class FakeHandle:
    """What ``amdsmi_get_processor_handles`` lists: opaque to the caller."""

    index: int


class FakeAmdSmi:
    """The subset of amdsmi wattlab uses, backed by ``SimulatedGpu`` objects.

    ``unsupported`` names values every GPU answers "N/A" or NOT_SUPPORTED for
    (``"current_socket_power"``, ``"average_socket_power"``, ``"amdsmi_get_energy_count"``,
    ``"amdsmi_get_gpu_activity"``, ...). ``missing_library`` makes ``amdsmi_init`` fail as
    on a host without the amdgpu driver.
    """

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiClkType = AmdSmiClkType
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    __version__ = "6.4.0 (simulated)"

    def __init__(self, gpus: Sequence[SimulatedGpu], *, counter_bits: int = 64,
                 start_units: int = 0, counter_scale: float = 1.0,
                 unsupported: Collection[str] = (), missing_library: bool = False) -> None:
        self.gpus = list(gpus)
        self.counter_bits = counter_bits
        self.start_units = start_units
        self.counter_scale = counter_scale
        self.unsupported = frozenset(unsupported)
        self.missing_library = missing_library
        self.initialised = False
        self.calls: set[str] = set()

    def _check(self, name: str) -> None:
        self.calls.add(name)
        if not self.initialised:
            raise AmdSmiLibraryException(STATUS_NOT_INIT)
        if name in self.unsupported:
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)

    def _gpu(self, handle: Any, name: str) -> SimulatedGpu:
        self._check(name)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise AmdSmiLibraryException(STATUS_INVAL)
        return self.gpus[handle.index]

    def _value(self, key: str, value: Any) -> Any:
        return "N/A" if key in self.unsupported else value

    # ------------------------------------------------------------------ library

    def amdsmi_init(self, flag: int = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        self.calls.add("amdsmi_init")
        if self.missing_library:
            raise AmdSmiLibraryException(STATUS_NOT_INIT)
        self.initialised = True

    def amdsmi_shut_down(self) -> None:
        self._check("amdsmi_shut_down")
        self.initialised = False

    def amdsmi_get_processor_handles(self) -> list[FakeHandle]:
        self._check("amdsmi_get_processor_handles")
        return [FakeHandle(i) for i in range(len(self.gpus))]

    # ------------------------------------------------------------------ identity

    def amdsmi_get_gpu_asic_info(self, processor_handle: Any) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_asic_info")
        return {"market_name": gpu.model.name, "vendor_id": 0x1002, "vendor_name": "AMD",
                "subvendor_id": 0x1002, "device_id": 0x74A1, "rev_id": 0,
                "asic_serial": f"0x{int(gpu.serial):016X}", "oam_id": gpu.index,
                "num_of_compute_units": 304, "target_graphics_version": "gfx942"}

    def amdsmi_get_gpu_device_uuid(self, processor_handle: Any) -> str:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_device_uuid")
        return gpu.uuid.removeprefix("GPU-")

    def amdsmi_get_gpu_driver_info(self, processor_handle: Any) -> dict[str, str]:
        self._gpu(processor_handle, "amdsmi_get_gpu_driver_info")
        return {"driver_name": "amdgpu", "driver_version": "6.10.5", "driver_date": "2015/01/01"}

    # ------------------------------------------------------------------ power and energy

    def amdsmi_get_power_info(self, processor_handle: Any) -> dict[str, Any]:
        """Socket power in whole W: current (instant) and the 1 s average."""
        gpu = self._gpu(processor_handle, "amdsmi_get_power_info")
        now = gpu.clock_ns()
        return {
            "current_socket_power": self._value(
                "current_socket_power", round(gpu.instant_power_mw(now) / 1e3)),
            "average_socket_power": self._value(
                "average_socket_power", round(gpu.average_power_mw(now) / 1e3)),
            "gfx_voltage": 800, "soc_voltage": 750, "mem_voltage": 1100,
            "power_limit": round(gpu.power_limit_w),
        }

    def amdsmi_get_energy_count(self, processor_handle: Any) -> dict[str, Any]:
        """The accumulator in units of ``counter_resolution`` µJ, and a ns timestamp."""
        gpu = self._gpu(processor_handle, "amdsmi_get_energy_count")
        now = gpu.clock_ns()
        units = self.start_units + int(gpu.energy_since_start_j(now) * self.counter_scale
                                       / (RESOLUTION_UJ * 1e-6))
        return {"energy_accumulator": units % (1 << self.counter_bits),
                "counter_resolution": RESOLUTION_UJ, "timestamp": now}

    def amdsmi_get_power_cap_info(self, processor_handle: Any) -> dict[str, int]:
        """Caps in µW."""
        gpu = self._gpu(processor_handle, "amdsmi_get_power_cap_info")
        lo, hi = gpu.model.power_limit_range_w
        return {"power_cap": round(gpu.power_limit_w * 1e6),
                "default_power_cap": round(gpu.model.default_power_limit_w * 1e6),
                "dpm_cap": 0, "min_power_cap": round(lo * 1e6), "max_power_cap": round(hi * 1e6)}

    # ------------------------------------------------------------------ state

    def amdsmi_get_clk_freq(self, processor_handle: Any, clk_type: int) -> dict[str, Any]:
        """Supported clocks in Hz (lowest first) and the index of the current one."""
        gpu = self._gpu(processor_handle, "amdsmi_get_clk_freq")
        now = gpu.clock_ns()
        if clk_type == AmdSmiClkType.GFX:
            levels, current = sorted(gpu.model.sm_clocks_mhz), gpu.sm_clock_mhz(now)
        elif clk_type == AmdSmiClkType.MEM:
            levels, current = sorted(gpu.model.mem_clocks_mhz), gpu.mem_clock_mhz
        else:
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)
        index = min(range(len(levels)), key=lambda i: abs(levels[i] - current))
        return {"num_supported": len(levels), "current": index,
                "frequency": [mhz * 1_000_000 for mhz in levels]}

    def amdsmi_get_gpu_activity(self, processor_handle: Any) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_activity")
        gfx, umc = gpu.utilisation_pct(gpu.clock_ns())
        return {"gfx_activity": gfx, "umc_activity": umc, "mm_activity": "N/A"}

    def amdsmi_get_temp_metric(self, processor_handle: Any, sensor_type: int,
                               metric: int) -> int:
        gpu = self._gpu(processor_handle, "amdsmi_get_temp_metric")
        if sensor_type == AmdSmiTemperatureType.EDGE:  # MI300 has no edge sensor
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)
        return round(gpu.temperature_c(gpu.clock_ns()))


def fake_amdsmi(count: int, seed: int = 0, *, apu: bool = False, **kwargs: Any) -> FakeAmdSmi:
    """``count`` simulated MI300X (or MI300A) GPUs behind one fake amdsmi."""
    return FakeAmdSmi(simulated_gpus(count, seed, model=MI300A if apu else MI300X), **kwargs)
