"""The recorder's live per-pod and per-job energy: streams and markers routed to each GPU.

Why from the rows the recorder already holds: each GPU's power rows (``gpu{i}.samples``,
channel ``power_w``) and its ``gpu{i}.processes`` rows and ``process``/``process-exit``
markers are all it needs (docs/processes.md); the split is :mod:`live_split`, the series
:mod:`process_series`. A MIG GPU's ``gpu{i}.mig`` stream stands in for its processes
(:mod:`mig_instances`). Not thread-safe: :class:`StreamMetrics` holds its lock around it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.samples import Marker, SourceDescriptor
from wattlab.sync.recorder.live_energy.live_split import GpuLiveSplit
from wattlab.sync.recorder.live_energy.mig_instances import MIG_SUFFIX, MigInstances
from wattlab.sync.recorder.live_energy.process_series import ProcessFigures, ProcessSeries

PROCESSES_SUFFIX = ".processes"
POWER_SUFFIX = ".samples"
POWER_CHANNEL = "power_w"


class LiveProcessEnergy:
    """Each GPU's live split, and the pod and job series they charge."""

    def __init__(self) -> None:
        self.series = ProcessSeries()
        self._splits: dict[str, GpuLiveSplit] = {}
        self._process_columns: dict[str, tuple[int, int]] = {}  # source -> (pid, sm_util_pct)
        self._power_column: dict[str, int] = {}  # power source -> its power_w column
        self._missing: dict[str, str] = {}  # gpu -> why it has no per-process stream
        self._mig = MigInstances(self.series)

    def describe(self, desc: SourceDescriptor) -> None:
        """Routes a GPU's power and per-process streams; notes a refused per-process query."""
        source, names = desc.source_id, desc.channel_names
        if self._mig.describe(desc, self._splits):
            return
        if source.endswith(PROCESSES_SUFFIX):
            gpu = source.removesuffix(PROCESSES_SUFFIX)
            self._splits.setdefault(gpu, GpuLiveSplit())
            self._process_columns[source] = (names.index("pid"), names.index("sm_util_pct"))
        elif source.endswith(POWER_SUFFIX) and POWER_CHANNEL in names:
            self._power_column[source] = names.index(POWER_CHANNEL)
            why = (desc.config.get("missing") or {}).get("processes")
            if why:
                self._missing[source.removesuffix(POWER_SUFFIX)] = str(why)

    def add_rows(self, source: str, t_ns: npt.NDArray[np.int64], values: npt.NDArray[Any]
                 ) -> None:
        """A batch of any stream: only a split GPU's power and per-process rows count."""
        mig_gpu = source.removesuffix(MIG_SUFFIX)
        if mig_gpu != source and self._mig.is_mig(mig_gpu):
            self._mig.add_rows(source, t_ns, values, self._splits[mig_gpu])
        elif source in self._process_columns:
            pid_col, sm_col = self._process_columns[source]
            split = self._splits[source.removesuffix(PROCESSES_SUFFIX)]
            split.add_processes(t_ns, values[:, pid_col].astype(np.float64, copy=False),
                                values[:, sm_col].astype(np.float64, copy=False))
        elif source in self._power_column:
            gpu = source.removesuffix(POWER_SUFFIX)
            power_split = self._splits.get(gpu)
            if power_split is not None:
                power = values[:, self._power_column[source]].astype(np.float64, copy=False)
                for window, joules in power_split.add_power(t_ns, power):
                    if self._mig.is_mig(gpu):  # the "pids" are its instances
                        self._mig.charge(gpu, window, joules)
                    else:
                        self.series.charge(gpu, joules)

    def add_markers(self, markers: list[Marker]) -> None:
        """``process`` and ``process-exit`` markers of the per-process and MIG streams."""
        for m in markers:
            if "pid" not in m.payload:
                continue
            if m.source.endswith(MIG_SUFFIX) and m.name in ("process", "process-exit"):
                gpu = m.source.removesuffix(MIG_SUFFIX)
                self._mig.marker(m, self._splits.setdefault(gpu, GpuLiveSplit()))
                continue
            if not m.source.endswith(PROCESSES_SUFFIX):
                continue
            gpu = m.source.removesuffix(PROCESSES_SUFFIX)
            split = self._splits.setdefault(gpu, GpuLiveSplit())
            if m.name == "process":
                self.series.arrive(gpu, m)
                split.presence(m.t_host_ns, int(m.payload["pid"]), came=True)
            elif m.name == "process-exit":
                self.series.leave(gpu, int(m.payload["pid"]), m.t_host_ns)
                split.presence(m.t_host_ns, int(m.payload["pid"]), came=False)

    def figures(self, now_ns: int) -> ProcessFigures:
        """The series as of ``now_ns`` (the recorder's monotonic clock), expired dropped."""
        self.series.expire(now_ns)
        pods, jobs = self.series.figures()
        idle = {gpu: s.idle_w for gpu, s in self._splits.items() if s.idle_w is not None}
        late = {gpu: s.late_rows for gpu, s in self._splits.items()}
        missing = {gpu: why for gpu, why in self._missing.items() if not self._mig.is_mig(gpu)}
        return ProcessFigures(pods, jobs, self.series.refused, idle, missing, late,
                              dict(self._mig.shared_j))
