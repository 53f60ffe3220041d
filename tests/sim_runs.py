"""Run files whose truth is known, written offline from the seeded simulated GPU.

Why offline: a real-time recording depends on the machine's load, these do not, so the
calibration tests and the golden snapshot (``tests/golden.py``) get the same bytes on every
machine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wattlab.acquisition.markers.simulated_phases import schedule_phases
from wattlab.device_models.workload_schedule import WorkloadSchedule
from wattlab.hardware.simulated_gpu import SimulatedGpu
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Marker, SourceDescriptor

MS = 1_000_000


def sim_descriptor(sid: str, kind: str, channels: list[tuple[str, str]],
                   **config: object) -> SourceDescriptor:
    """A stream as a simulated H100 (``nvml``) or a plain meter would describe itself."""
    return SourceDescriptor(sid, kind, "Simulated H100 80GB HBM3" if kind == "nvml" else "meter",
                            tuple(Channel(n, "W", m) for n, m in channels),
                            firmware="580.1", config={"driver_version": "580.1", **config})


def write_sim_run(path: Path, seed: int = 3, duration_s: float = 40.0, gain: float = 1.07,
                  offset_w: float = 5.0) -> SimulatedGpu:
    """A run whose truth is known: reference = true power at 1 kHz, NVML views polled at 50 Hz.

    ``gpu0.power`` holds the simulator's instant and average readings as polled;
    ``gpu0.scaled`` is the average reading with a known gain and offset applied.
    """
    gpu = SimulatedGpu(0, seed, WorkloadSchedule.random(seed, duration_s), clock_ns=lambda: 0,
                       start_ns=0, unix_offset_ns=0)
    writer = RunFileWriter(str(path), {"created": "test"}, 0)
    writer.add_source(sim_descriptor("meter", "meter", [("power_w", "true power")]))
    writer.add_source(sim_descriptor("gpu0.power", "nvml",
                            [("instant_power_w", "NVML_FI_DEV_POWER_INSTANT"),
                             ("average_power_w", "nvmlDeviceGetPowerUsage")]))
    writer.add_source(sim_descriptor("gpu0.scaled", "nvml",
                                     [("average_power_w", "scaled average")]))
    t_ref = np.arange(0, int(duration_s * 1000)) * MS
    p_ref = gpu.true_power_w_array(t_ref)
    writer.append("meter", t_ref, t_ref, p_ref.reshape(-1, 1), np.zeros(t_ref.size, np.uint8))
    t_poll = np.arange(5, int(duration_s * 50)) * 20 * MS + 3 * MS
    inst = np.array([gpu.instant_power_mw(int(t)) for t in t_poll]) / 1e3
    avg = np.array([gpu.average_power_mw(int(t)) for t in t_poll]) / 1e3
    zeros = np.zeros(t_poll.size, np.uint8)
    writer.append("gpu0.power", t_poll, t_poll, np.column_stack([inst, avg]), zeros)
    writer.append("gpu0.scaled", t_poll, t_poll, (gain * avg + offset_w).reshape(-1, 1), zeros)
    markers = []
    for a, b, name in schedule_phases(gpu):
        markers += [Marker(round(a * 1e9), name, "begin", "schedule"),
                    Marker(round(b * 1e9), name, "end", "schedule")]
    writer.add_markers(markers)
    writer.close()
    return gpu
