"""What NVML says a GPU is: its identity and limits, its clocks, what its power covers.

Why a module of its own: these are read once, to describe a GPU in the run file and to
choose what to sweep, and each tolerates calls a GPU does not support in its own way (a
missing item is noted or left at the plain case, never an error); the driver (nvml.py)
keeps the session, the readings and the setters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import pynvml

from wattlab.drivers.gpu_scope import VIRTUALIZATION, GpuScope
from wattlab.errors import NvmlError


def is_not_supported(e: pynvml.NVMLError) -> bool:
    """NVML's answer for a call or field this GPU lacks."""
    return bool(getattr(e, "value", None) == pynvml.NVML_ERROR_NOT_SUPPORTED)


@dataclass
class DeviceInfo:
    """Identity and limits of one GPU; ``missing`` maps unsupported items to NVML's message."""

    index: int
    name: str = ""
    uuid: str = ""
    serial: str = ""
    board_part_number: str = ""
    driver_version: str = ""
    nvml_version: str = ""
    power_limit_min_w: float | None = None
    power_limit_max_w: float | None = None
    power_limit_default_w: float | None = None
    power_limit_w: float | None = None
    sm_clocks_mhz: list[int] = field(default_factory=list)
    mem_clocks_mhz: list[int] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain dict for descriptors and ``wattlab info``."""
        return asdict(self)


def read_device_info(lib: Any, h: Any, gpu: int) -> DeviceInfo:
    """Everything the run file should say about GPU ``gpu`` (NVML handle ``h``).

    Unsupported items go to ``missing``.
    """
    info = DeviceInfo(index=gpu)

    def get(item: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except pynvml.NVMLError as e:
            if is_not_supported(e) or getattr(e, "value", None) in (
                pynvml.NVML_ERROR_NOT_FOUND,
                pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            ):
                info.missing[item] = str(e)
                return None
            raise NvmlError(f"GPU {gpu}: reading {item} failed: {e}") from e

    info.name = get("name", lambda: lib.nvmlDeviceGetName(h)) or ""
    info.uuid = get("uuid", lambda: lib.nvmlDeviceGetUUID(h)) or ""
    info.serial = get("serial", lambda: lib.nvmlDeviceGetSerial(h)) or ""
    info.board_part_number = (
        get("board_part_number", lambda: lib.nvmlDeviceGetBoardPartNumber(h)) or ""
    )
    info.driver_version = get("driver_version", lib.nvmlSystemGetDriverVersion) or ""
    info.nvml_version = get("nvml_version", lib.nvmlSystemGetNVMLVersion) or ""
    limits = get(
        "power_limit_range", lambda: lib.nvmlDeviceGetPowerManagementLimitConstraints(h)
    )
    if limits is not None:
        info.power_limit_min_w, info.power_limit_max_w = limits[0] / 1e3, limits[1] / 1e3
    default = get(
        "power_limit_default", lambda: lib.nvmlDeviceGetPowerManagementDefaultLimit(h)
    )
    info.power_limit_default_w = None if default is None else default / 1e3
    current = get("power_limit", lambda: lib.nvmlDeviceGetPowerManagementLimit(h))
    info.power_limit_w = None if current is None else current / 1e3
    mem = get("mem_clocks", lambda: lib.nvmlDeviceGetSupportedMemoryClocks(h))
    info.mem_clocks_mhz = [int(c) for c in mem or []]
    if info.mem_clocks_mhz:
        top = max(info.mem_clocks_mhz)
        sm = get("sm_clocks", lambda: lib.nvmlDeviceGetSupportedGraphicsClocks(h, top))
        info.sm_clocks_mhz = [int(c) for c in sm or []]
    return info


def read_clock_pairs(lib: Any, h: Any, gpu: int) -> list[tuple[int, int]]:
    """Every supported (SM MHz, memory MHz) pair, highest first (read only).

    NVML lists the SM clocks per memory clock. Raises ``NvmlError`` naming what failed.
    """
    try:
        mems = [int(m) for m in lib.nvmlDeviceGetSupportedMemoryClocks(h)]
        pairs = [(int(sm), m) for m in mems
                 for sm in lib.nvmlDeviceGetSupportedGraphicsClocks(h, m)]
    except pynvml.NVMLError as e:
        raise NvmlError(f"GPU {gpu}: reading the supported clocks failed: {e}") from e
    if not pairs:
        raise NvmlError(f"GPU {gpu}: NVML lists no supported clocks")
    return sorted(set(pairs), reverse=True)


def read_scope(lib: Any, h: Any, gpu: int, name: str) -> GpuScope:
    """MIG mode, virtualisation mode and module power of a GPU: what its readings cover.

    A module is a GPU that answers the module power scope and is named a Grace module
    (GH200, GB200): there NVML's power and energy cover CPU, GPU and memory together.
    Calls a GPU does not support leave the plain case (no MIG, bare metal, board power).
    """

    def ask(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except pynvml.NVMLError as e:
            if is_not_supported(e) or getattr(e, "value", None) in (
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_NOT_FOUND):
                return None
            raise NvmlError(f"GPU {gpu}: reading what its power covers failed: {e}") from e

    mig = ask(lambda: lib.nvmlDeviceGetMigMode(h))
    mode = ask(lambda: lib.nvmlDeviceGetVirtualizationMode(h))
    module_field = ask(lambda: lib.nvmlDeviceGetFieldValues(
        h, [(pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_POWER_SCOPE_MODULE)]))
    module_scope = (module_field is not None
                    and module_field[0].nvmlReturn == pynvml.NVML_SUCCESS)
    grace = any(tag in name.upper() for tag in ("GH200", "GB200", "GRACE"))
    return GpuScope(mig=bool(mig) and mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE,
                    virtualization=VIRTUALIZATION.get(int(mode or 0), str(mode)),
                    module=module_scope and grace)
