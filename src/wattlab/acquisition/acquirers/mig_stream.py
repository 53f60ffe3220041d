"""The ``gpu{i}.mig`` stream: each MIG instance's activity, the per-process stream's stand-in.

Why: on a MIG-partitioned GPU the driver gives no per-process utilisation (NOT_SUPPORTED)
and no per-instance power (NOT_SUPPORTED on a MIG device handle of an H100), so "whose
joules" can only be answered per GPU instance, from its own activity: GPM's SM and
DRAM-bandwidth utilisation of the instance over each read interval. Read every 0.09 s by
default (the ``mig`` cadence): GPM answers for any interval, and a coarser read blurs the
phases. docs/processes.md has the layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pynvml

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading
from wattlab.acquisition.acquirers.process_stream import ProcessStream, identity_sources
from wattlab.drivers.nvml_samples import GpmActivity, MigDevice, mig_devices
from wattlab.errors import NvmlError
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor

MIG_CHANNELS = (
    Channel("gi", "1", "GPU instance id (nvmlDeviceGetGpuInstanceId)"),
    Channel("sm_util_pct", "%", "GPM SM utilisation of the instance's own SMs since the "
                                "previous row of this instance (nvmlGpmMigSampleGet)"),
    Channel("dram_bw_util_pct", "%", "GPM DRAM bandwidth utilisation of the instance's memory "
                                     "slice over the same interval"),
    Channel("processes", "1", "compute processes in the instance at the read "
                              "(nvmlDeviceGetComputeRunningProcesses, gpuInstanceId)"),
)


def instance_power_refusal(lib: Any, devices: list[MigDevice]) -> str | None:
    """NVML's answer to a MIG device's power query (None: it gave a power, unused here)."""
    for d in devices:
        try:
            lib.nvmlDeviceGetPowerUsage(d.handle)
        except pynvml.NVMLError as e:
            return str(e)
    return None


def mig_reader(driver: Any, gpu: int, source_id: str, *, t_ns: int,
               missing: dict[str, str], cmdlines: bool = False) -> MigReader | None:
    """The reader of a MIG GPU's instances; None, with ``missing["mig"]`` saying why."""
    try:
        return MigReader(driver, gpu, source_id, t_ns=t_ns, cmdlines=cmdlines)
    except NvmlError as e:
        missing["mig"] = str(e)
        return None


class MigReader:
    """One MIG GPU's instances, read into rows of ``MIG_CHANNELS`` (one per instance a read).

    Making one raises ``NvmlError`` where the GPU has no instance or no GPM (the stream is
    then missing, with that reason); a read that fails later is a Gap, as for the processes.
    Who ran in which instance: a ``process`` marker (the per-process stream's identity, with
    the instance's ``gi``) when a process appears, ``process-exit`` when it is gone, so an
    instance's energy can be charged to its jobs and pods.
    """

    def __init__(self, driver: Any, gpu: int, source_id: str, *, t_ns: int,
                 cmdlines: bool = False) -> None:
        self.lib, self.handle = driver.lib, driver.handle(gpu)
        self.gpu, self.source_id = gpu, source_id
        self.open_ns = self.good_ns = t_ns
        try:
            self.devices = mig_devices(self.lib, self.handle)
            gpm = self.lib.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice
        except pynvml.NVMLError as e:
            raise NvmlError(f"GPU {gpu}: listing its MIG instances or GPM failed: {e}") from e
        if not self.devices:
            raise NvmlError(f"GPU {gpu}: MIG is on but it has no GPU instance")
        if not gpm:
            raise NvmlError(f"GPU {gpu}: GPM is not supported (Hopper or newer): no "
                            "per-instance activity")
        self.power_refusal = instance_power_refusal(self.lib, self.devices)
        self._activity = GpmActivity(self.lib, self.handle, [d.gi for d in self.devices])
        try:
            self._activity.read()  # the first GPM samples: rows from the next read on
        except pynvml.NVMLError as e:
            self._activity.close()
            raise NvmlError(f"GPU {gpu}: the first GPM sample failed: {e}") from e
        self._sim_truth = getattr(self.lib, "wattlab_simulated_truth", None)
        who, ticks = identity_sources(driver, gpu, cmdlines=cmdlines)
        self._gi_of: dict[int, int] = {}
        self.presence = ProcessStream(gpu, source_id, 0, start_ticks=ticks,
                                      identify=lambda pid: {**who(pid),
                                                            "gi": self._gi_of.get(pid)},
                                      to_host_ns=lambda us: us * 1000)

    def describe(self, base: SourceDescriptor) -> SourceDescriptor:
        """The stream's descriptor: ``base``'s device and config, the instances added."""
        return dataclasses.replace(
            base, source_id=self.source_id, kind=f"{base.kind}-mig", channels=MIG_CHANNELS,
            time_raw=SourceDescriptor.time_raw,
            config={**base.config, "instances": [
                {"gi": d.gi, "profile": d.profile, "sm_count": d.sm_count,
                 "slices": d.slices} for d in self.devices],
                "instance_power": self.power_refusal or "given by NVML, not read"})

    def read(self, clock_ns: Callable[[], int]) -> list[Reading]:
        """One read: a row per instance over the time since the last read, or a Gap."""
        t0 = clock_ns()
        try:  # the list first: if it fails, GPM's samples stay where the last row ended
            running = self.lib.nvmlDeviceGetComputeRunningProcesses(self.handle)
            activity = self._activity.read()
        except pynvml.NVMLError as e:
            t1 = clock_ns()
            gap = Gap(self.source_id, f"GPM or the running processes: {e}",
                      t_first_ns=self.good_ns, t_last_ns=t1)
            self.good_ns = t1
            return [gap]
        t_ns = (t0 + clock_ns()) // 2
        self.good_ns = t_ns
        count = {d.gi: 0 for d in self.devices}
        memory_b: dict[int, float] = {}
        self._gi_of = {}  # the running ones only: a new arrival is looked up in it
        for p in running:
            gi = int(getattr(p, "gpuInstanceId", -1))
            if gi in count:
                count[gi] += 1
            self._gi_of[int(p.pid)] = gi
            memory_b[int(p.pid)] = float(getattr(p, "usedGpuMemory", None) or math.nan)
        out = self.presence.update(None, memory_b, 0, t_ns)  # markers: who came and went
        rows = [[float(gi), sm, dram, float(count[gi])] for gi, (sm, dram) in
                sorted(activity.items())]
        if rows:
            out.append(Chunk(self.source_id, np.full(len(rows), t_ns, dtype=np.int64),
                             np.array(rows, dtype=np.float64)))
        return out

    def truth(self, t_ns: int) -> list[Reading]:
        """The simulator's ``simulated-truth`` marker from open to ``t_ns`` (none if real)."""
        payload = None if self._sim_truth is None else self._sim_truth(self.gpu, self.open_ns,
                                                                        t_ns)
        if payload is None:
            return []
        return [Marker(t_ns, "simulated-truth", "point", self.source_id,
                       {"gpu": self.gpu, **payload})]

    def close(self) -> None:
        self._activity.close()
