"""The descriptors of a GPU reader's streams: what each holds and which driver call it is.

Why a module of its own: the GPU reader (nvml_acquirer.py) describes its streams once, at
open, from what the GPU turned out to support; which streams exist, their channels, units
and calls, is a question apart from the polling that fills them.
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Mapping
from typing import Any

from wattlab.acquisition.acquirers.process_stream import PROCESS_CHANNELS
from wattlab.drivers.nvml_identity import DeviceInfo
from wattlab.samples import Channel, SourceDescriptor

STATE_UNITS = {
    "sm_clock_hz": "Hz",
    "mem_clock_hz": "Hz",
    "gpu_util_pct": "%",
    "temperature_c": "degC",
    "power_limit_w": "W",
}


def describe_streams(kind: str, calls: Mapping[str, str], info: DeviceInfo,
                     config: Mapping[str, Any], *, ids: Mapping[str, str],
                     streams: Collection[str], missing: Collection[str],
                     power_names: list[str], state_names: list[str],
                     sample_period_s: float, buffer_capacity: int
                     ) -> dict[str, SourceDescriptor]:
    """The descriptor of each stream asked for that the GPU supports, by stream key.

    ``kind``: the driver's (``nvml``, ``amdsmi``), ``calls`` its call per reading;
    ``config`` goes into every descriptor, with the stream's own calls added.
    """
    out: dict[str, SourceDescriptor] = {}

    def describe(key: str, channels: list[tuple[str, str, str]], **extra: Any) -> None:
        out[key] = SourceDescriptor(
            source_id=ids[key],
            kind=kind,
            model=info.name,
            channels=tuple(Channel(n, u, calls[c]) for n, u, c in channels),
            serial=info.serial or info.uuid,
            firmware=info.driver_version,
            transport=kind,
            host=socket.gethostname(),
            value_dtype="<f8",
            config={**config, "nvml_calls": {n: calls[c] for n, _, c in channels}, **extra},
            # the driver's samples carry its own stamps; the rest host times
            time_raw=("device_unix_us" if key in ("samples", "processes")
                      else SourceDescriptor.time_raw),
        )

    if "samples_power_w" not in missing and "samples" in streams:
        describe(
            "samples",
            [("power_w", "W", "samples_power_w")],
            sample_period_s=sample_period_s,
            buffer_capacity=buffer_capacity,
        )
    power = [(n, "W", n) for n in power_names]
    if power and "power" in streams:
        describe("power", power, power_channel=power[0][0])
    if "energy_j" not in missing and "energy" in streams:
        describe("energy", [("energy_j", "J", "energy_j")])
    if state_names and "state" in streams:
        describe("state", [(n, STATE_UNITS[n], n) for n in state_names],
                 power_channel=None)  # its only watts are the power *limit*
    if "processes" not in missing and "processes" in streams:
        describe("processes", [(n, u, "process_memory" if n == "used_memory_b" else "processes")
                               for n, u in PROCESS_CHANNELS], power_channel=None)
    return out
