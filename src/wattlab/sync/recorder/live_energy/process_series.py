"""Per-pod and per-job energy series of each GPU, with bounded cardinality.

Why pods and jobs and never pids: a pid is born and dies thousands of times a day on a
busy node; a series per pid would grow the scraper's index without bound. A pod's or job's
series lives while any of its processes is on the GPU, and ``SERIES_GRACE_S`` after its
last one left (its ``process-exit`` markers), so the scraper reads its final value; then it
is dropped (as Kepler does). At most ``MAX_SERIES`` live at once; a series over the cap is
refused and counted, never silently merged into another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from wattlab.samples import Marker
from wattlab.sync.recorder.live_energy.live_split import SETTLE_S, WINDOW_S

# two scrape intervals of Prometheus's default 15 s: the scraper sees the final value
SERIES_GRACE_S = 30.0
GRACE_ENV = "WATTLAB_TEST_SERIES_GRACE_S"  # tests: a shorter grace, in seconds
# never shorter than it takes the process's last window to be charged
MIN_GRACE_S = SETTLE_S + WINDOW_S
MAX_SERIES = 1000  # live pod and job series, all GPUs together

Key = tuple[str, ...]  # ("pod", gpu, uid) or ("job", gpu, job)


def grace_ns() -> int:
    """The grace period, which a test may shorten through ``GRACE_ENV`` (to ``MIN_GRACE_S``)."""
    return int(max(float(os.environ.get(GRACE_ENV, SERIES_GRACE_S)), MIN_GRACE_S) * 1e9)


@dataclass
class GroupSeries:
    """One pod's or job's energy on one GPU."""

    labels: dict[str, str]
    energy_j: float = 0.0
    live: set[int] = field(default_factory=set)  # its pids on the GPU now
    left_ns: int | None = None  # when its last process left


@dataclass
class ProcessFigures:
    """What the exporter shows of the processes at one instant."""

    pods: list[tuple[dict[str, str], float]]
    jobs: list[tuple[dict[str, str], float]]
    refused: int
    idle_w: dict[str, float]  # gpu -> the live idle estimate (absent: not yet known)
    missing: dict[str, str]  # gpu -> why it has no per-process stream
    # gpu -> per-process rows that came after their window was charged (a late stream)
    late_rows: dict[str, int] = field(default_factory=dict)
    # (gpu, gi, "pod"|"job") -> J of a MIG instance that held several pods' (jobs') processes
    shared_j: dict[tuple[str, int, str], float] = field(default_factory=dict)


class ProcessSeries:
    """Pids to their pod and job (from ``process`` markers), and each group's energy."""

    def __init__(self, max_series: int = MAX_SERIES) -> None:
        self.max_series = max_series
        self.refused = 0
        self._groups: dict[Key, GroupSeries] = {}
        self._owners: dict[tuple[str, int], list[Key]] = {}  # (gpu, pid) -> its groups

    def arrive(self, gpu: str, marker: Marker) -> None:
        """A ``process`` marker: the pid joins its pod's and its job's series."""
        pid = int(marker.payload["pid"])
        self.leave(gpu, pid, marker.t_host_ns)  # a reused pid: its old owner lost it
        keys = []
        for key, labels in group_labels(gpu, marker.payload):
            group = self._groups.get(key)
            if group is None:
                if len(self._groups) >= self.max_series:
                    self.refused += 1
                    continue
                group = self._groups[key] = GroupSeries(labels)
            group.live.add(pid)
            group.left_ns = None
            keys.append(key)
        self._owners[(gpu, pid)] = keys

    def leave(self, gpu: str, pid: int, t_ns: int) -> None:
        """A ``process-exit`` marker: the pid's groups are one process lighter."""
        for key in self._owners.get((gpu, pid), []):
            group = self._groups.get(key)
            if group is not None and pid in group.live:
                group.live.discard(pid)
                if not group.live:
                    group.left_ns = t_ns

    def charge(self, gpu: str, joules_by_pid: dict[int, float]) -> None:
        """Energy of the GPU's pids; a pid with no pod or job charges nobody here."""
        for pid, joules in joules_by_pid.items():
            for key in self._owners.get((gpu, pid), []):
                group = self._groups.get(key)
                if group is not None:
                    group.energy_j += joules

    def charge_keys(self, joules_by_key: dict[Key, float]) -> None:
        """Energy of named pod and job series (a MIG instance's); a dropped one charges nobody."""
        for key, joules in joules_by_key.items():
            group = self._groups.get(key)
            if group is not None:
                group.energy_j += joules

    def expire(self, now_ns: int) -> None:
        """Drop the series whose processes all left more than the grace period ago."""
        cut = now_ns - grace_ns()
        gone = [k for k, g in self._groups.items() if g.left_ns is not None and g.left_ns < cut]
        for key in gone:
            del self._groups[key]
        if gone:
            dropped = set(gone)
            self._owners = {o: [k for k in ks if k not in dropped]
                            for o, ks in self._owners.items()
                            if any(k not in dropped for k in ks)}

    def figures(self) -> tuple[list[tuple[dict[str, str], float]],
                               list[tuple[dict[str, str], float]]]:
        """(pod series, job series): labels and energy so far."""
        pods = [(dict(g.labels), g.energy_j) for k, g in self._groups.items() if k[0] == "pod"]
        jobs = [(dict(g.labels), g.energy_j) for k, g in self._groups.items() if k[0] == "job"]
        return pods, jobs


def group_labels(gpu: str, payload: dict[str, Any]) -> list[tuple[Key, dict[str, str]]]:
    """The pod and the Slurm job a process marker names (either, both or none)."""
    out: list[tuple[Key, dict[str, str]]] = []
    uid = payload.get("pod_uid")
    if uid:
        out.append((("pod", gpu, str(uid)),
                    {"gpu": gpu, "pod_uid": str(uid),
                     "pod_name": str(payload.get("pod_name") or ""),
                     "namespace": str(payload.get("pod_namespace") or "")}))
    job = payload.get("slurm_job")
    if job is not None and job != "":
        out.append((("job", gpu, str(job)), {"gpu": gpu, "slurm_job": str(job)}))
    return out
