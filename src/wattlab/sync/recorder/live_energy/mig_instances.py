"""A MIG GPU's live split: its instances in place of its processes, charged to their owners.

Why instances: on a MIG GPU the driver gives no per-process utilisation, only each
instance's activity (the ``gpu{i}.mig`` stream, docs/processes.md). So the GPU's split
(:mod:`live_split`, Kepler's rule) shares the dynamic energy among instances, each weighted
by its SM utilisation times its share of the partitioned SMs (as ``energy --by-instance``
weighs them); an instance is present while processes run in it. An instance's joules go to
the pod and the job of the processes seen in it since its current stretch began (it was
empty before): one pod (one job) is charged; processes of several, or one with none and
one with some, charge none of them, and their joules are counted per instance, as
``energy --by-job``/``--by-pod`` rule after the run. A window is charged by the owners as
they stood at its end, so one that settles after its instance emptied still finds them.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.samples import Marker, SourceDescriptor
from wattlab.sync.recorder.live_energy.live_split import WINDOW_NS, GpuLiveSplit
from wattlab.sync.recorder.live_energy.process_series import Key, ProcessSeries, group_labels

MIG_SUFFIX = ".mig"
KINDS = ("pod", "job")
SHARED = "shared"  # a verdict: processes of several pods (jobs) ran in the stretch
Verdict = tuple[Key | str | None, ...]  # per kind: the key charged, SHARED, or None


@dataclass
class Instance:
    """One GPU instance: its processes now, those of its stretch, the verdicts over time."""

    live: set[int] = field(default_factory=set)
    stretch: dict[int, tuple[Key | None, ...]] = field(default_factory=dict)  # pid -> keys
    changes_ns: list[int] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)

    def verdict(self) -> Verdict:
        out: list[Key | str | None] = []
        for i in range(len(KINDS)):
            keys = {keys[i] for keys in self.stretch.values()}
            out.append(next(iter(keys)) if len(keys) == 1 else SHARED if keys else None)
        return tuple(out)

    def at(self, t_ns: int) -> Verdict:
        """The verdict in force just before ``t_ns`` (the end of a window)."""
        i = bisect_left(self.changes_ns, t_ns)
        return self.verdicts[i - 1] if i else (None,) * len(KINDS)


class MigInstances:
    """Each MIG GPU's instances: their rows to its split, their joules to pods and jobs."""

    def __init__(self, series: ProcessSeries) -> None:
        self.series = series
        # energy charged to none: (gpu, gi, "pod"|"job") -> J
        self.shared_j: dict[tuple[str, int, str], float] = {}
        self._columns: dict[str, tuple[int, int]] = {}  # source -> (gi, sm_util_pct)
        self._share: dict[str, dict[int, float]] = {}  # gpu -> gi -> its share of the SMs
        self._instances: dict[str, dict[int, Instance]] = {}
        self._gi_of: dict[tuple[str, int], int] = {}  # (gpu, pid) -> its instance

    def describe(self, desc: SourceDescriptor, splits: dict[str, GpuLiveSplit]) -> bool:
        """Routes a ``gpu{i}.mig`` stream (True), with its instances' shares of the SMs."""
        if not desc.source_id.endswith(MIG_SUFFIX):
            return False
        gpu, names = desc.source_id.removesuffix(MIG_SUFFIX), desc.channel_names
        instances = desc.config.get("instances") or []
        all_sms = sum(i["sm_count"] for i in instances) or 1
        self._share[gpu] = {int(i["gi"]): i["sm_count"] / all_sms for i in instances}
        self._columns[desc.source_id] = (names.index("gi"), names.index("sm_util_pct"))
        splits.setdefault(gpu, GpuLiveSplit())
        return True

    def is_mig(self, gpu: str) -> bool:
        return gpu in self._share

    def add_rows(self, source: str, t_ns: npt.NDArray[np.int64], values: npt.NDArray[Any],
                 split: GpuLiveSplit) -> None:
        """Instance rows to the split: the instance as the "pid", SM % times its SM share."""
        gi_col, sm_col = self._columns[source]
        gi = values[:, gi_col].astype(np.float64, copy=False)
        shares = self._share[source.removesuffix(MIG_SUFFIX)]
        weight = np.array([shares.get(int(g), 0.0) if np.isfinite(g) else 0.0 for g in gi])
        split.add_processes(t_ns, gi, values[:, sm_col].astype(np.float64) * weight)

    def marker(self, m: Marker, split: GpuLiveSplit) -> None:
        """A ``process`` (with its ``gi``) or ``process-exit`` marker of a MIG stream."""
        gpu, pid = m.source.removesuffix(MIG_SUFFIX), int(m.payload["pid"])
        instances = self._instances.setdefault(gpu, {})
        if m.name == "process":
            self.series.arrive(gpu, m)  # the series' lifetimes, as on a GPU without MIG
            self._leave(gpu, pid, m.t_host_ns, split)  # a reused pid left its old one
            if m.payload.get("gi") is None:
                return
            gi = int(m.payload["gi"])
            inst = instances.setdefault(gi, Instance())
            if not inst.live:  # a new stretch: the owners of the last one no longer count
                inst.stretch = {}
                split.presence(m.t_host_ns, gi, came=True)
            inst.live.add(pid)
            labels = dict(group_labels(gpu, m.payload))
            inst.stretch[pid] = tuple(next((k for k in labels if k[0] == kind), None)
                                      for kind in KINDS)
            self._gi_of[(gpu, pid)] = gi
            inst.changes_ns.append(m.t_host_ns)
            inst.verdicts.append(inst.verdict())
        elif m.name == "process-exit":
            self.series.leave(gpu, pid, m.t_host_ns)
            self._leave(gpu, pid, m.t_host_ns, split)

    def _leave(self, gpu: str, pid: int, t_ns: int, split: GpuLiveSplit) -> None:
        gi = self._gi_of.pop((gpu, pid), None)
        inst = None if gi is None else self._instances.get(gpu, {}).get(gi)
        if gi is None or inst is None or pid not in inst.live:
            return
        inst.live.discard(pid)
        if not inst.live:
            split.presence(t_ns, gi, came=False)

    def charge(self, gpu: str, window: int, joules_by_gi: dict[int, float]) -> None:
        """A settled window's joules per instance, to the owners its stretch had then."""
        end_ns = (window + 1) * WINDOW_NS
        charges: dict[Key, float] = {}
        instances = self._instances.get(gpu, {})
        for gi, joules in joules_by_gi.items():
            verdicts = instances[gi].at(end_ns) if gi in instances else (None,) * len(KINDS)
            for kind, verdict in zip(KINDS, verdicts, strict=True):
                if verdict == SHARED:
                    key = (gpu, gi, kind)
                    self.shared_j[key] = self.shared_j.get(key, 0.0) + joules
                elif isinstance(verdict, tuple):
                    charges[verdict] = charges.get(verdict, 0.0) + joules
        self.series.charge_keys(charges)
        for inst in instances.values():  # windows settle in order: older verdicts go
            drop = max(0, bisect_left(inst.changes_ns, window * WINDOW_NS) - 1)
            del inst.changes_ns[:drop], inst.verdicts[:drop]
