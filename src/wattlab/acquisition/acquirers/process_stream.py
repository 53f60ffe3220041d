"""The ``gpu{i}.processes`` stream: per-process utilisation rows and identity markers.

Why apart from the reader (nvml_acquirer.py): turning one read of the driver's per-process
answers into rows and markers is pure bookkeeping (which samples are new, which process is
new, gone or a reused pid), tested without a clock; the reader only calls it on the state
cadence's wake-ups. The stream's layout is docs/processes.md's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading
from wattlab.acquisition.acquirers.process_identity import (
    IDENTITY_KEYS,
    PODS,
    PROC,
    cgroup_fields,
    identify,
    start_ticks,
)
from wattlab.drivers.nvml_samples import ProcessSample
from wattlab.errors import NvmlError
from wattlab.samples import Gap, Marker

PROCESS_CHANNELS = (("pid", "1"), ("sm_util_pct", "%"), ("mem_util_pct", "%"),
                    ("enc_util_pct", "%"), ("dec_util_pct", "%"), ("used_memory_b", "B"))
Identify = Callable[[int], dict[str, Any]]
StartTicks = Callable[[int], int | None]
# how long after the read that no longer listed a process a sample of its own may still
# come: the driver's per-process sample covers the period before its stamp (~1/6 s on
# H100/H200, with jitter), so the one covering a context's last work can be stamped after
# the context was gone (seen on the simulated GPU read every 0.15 s: the process was marked
# gone, then again as new, then gone, its late sample a process of its own)
LAST_SAMPLE_AFTER_EXIT_NS = 250_000_000


class ProcessStream:
    """One GPU's per-process rows and markers, read after read.

    ``identify(pid)`` gives the identity fields (``IDENTITY_KEYS``) of a host pid;
    ``start_ticks(pid)`` only its start time, read every time to see a reused pid.
    ``to_host_ns`` turns the driver's unix µs into host ns (as for ``gpu{i}.samples``).
    """

    def __init__(self, gpu: int, source_id: str, last_seen_us: int, *,
                 identify: Identify, start_ticks: StartTicks,
                 to_host_ns: Callable[[int], int]) -> None:
        self.gpu = gpu
        self.source_id = source_id
        self.last_seen_us = last_seen_us
        self._identify = identify
        self._start_ticks = start_ticks
        self._to_host_ns = to_host_ns
        self.known: dict[int, int | None] = {}  # pid -> start_ticks of the process marked
        self.left: dict[int, tuple[int | None, int]] = {}  # pid -> (start_ticks, exit ns)

    def update(self, samples: list[ProcessSample] | None, memory_b: Mapping[int, float],
               read_us: int, read_ns: int) -> list[Reading]:
        """Rows and markers for one read: samples newer than the last seen, oldest first.

        ``memory_b``: the running processes' used memory (NaN: the driver did not say).
        The driver lists only processes active since the last seen stamp, so a running
        process without a sample in a successful read was idle over it: it gets one row at
        the read instant with zero utilisation and its memory. ``samples`` None: the
        utilisation was not read (a process alone): no rows, only who came and went.
        """
        read = samples is not None
        samples = sorted((s for s in samples or () if s[1] > self.last_seen_us),
                         key=lambda s: (s[1], s[0]))
        first_ns: dict[int, int] = {}
        for s in samples:
            first_ns.setdefault(s[0], self._to_host_ns(s[1]))
        idle = [pid for pid in memory_b if pid not in first_ns]
        for pid in idle:
            first_ns[pid] = read_ns
        out: list[Reading] = []
        for pid in [p for p in self.known if p not in first_ns]:  # left the GPU
            out.append(self._exit(pid, read_ns))
        self.left = {pid: v for pid, v in self.left.items()
                     if read_ns - v[1] <= LAST_SAMPLE_AFTER_EXIT_NS}
        for pid, t_ns in sorted(first_ns.items(), key=lambda kv: (kv[1], kv[0])):
            if not self._last_sample_of_the_gone(pid, t_ns, memory_b):
                out += self._arrive(pid, t_ns)
        rows = [(self._to_host_ns(s[1]), s[1], [float(s[0]), *map(float, s[2:6]),
                                                memory_b.get(s[0], math.nan)])
                for s in samples]
        rows += [(read_ns, read_us, [float(pid), 0.0, 0.0, 0.0, 0.0, memory_b[pid]])
                 for pid in sorted(idle) if read]
        if samples:
            self.last_seen_us = samples[-1][1]
        if rows:
            rows.sort(key=lambda r: (r[0], r[2][0]))
            out.append(Chunk(self.source_id, np.array([r[0] for r in rows], dtype=np.int64),
                             np.array([r[2] for r in rows], dtype=np.float64),
                             t_raw=np.array([r[1] for r in rows], dtype=np.int64)))
        return out

    def _arrive(self, pid: int, t_ns: int) -> list[Reading]:
        """A "process" marker for a pid first seen, or seen again with another start."""
        if pid in self.known:
            ticks = self._start_ticks(pid)
            old = self.known[pid]
            if ticks is None or old is None or ticks == old:
                return []
            return [self._exit(pid, t_ns), *self._arrive(pid, t_ns)]  # a reused pid
        identity = {**dict.fromkeys(IDENTITY_KEYS), **self._identify(pid)}
        self.known[pid] = identity["start_ticks"]
        return [Marker(t_ns, "process", "point", self.source_id,
                       {"gpu": self.gpu, "pid": pid, **identity})]

    def _last_sample_of_the_gone(self, pid: int, t_ns: int, memory_b: Mapping[int, float]
                                 ) -> bool:
        """Whether ``pid``'s sample is the last one of a process just marked gone.

        Stamped within the driver's period after its exit, not listed running, the same
        start (or none readable): its row stays (the analysis gives it to that process),
        with no new "process" marker.
        """
        gone = self.left.get(pid)
        if gone is None or pid in self.known or pid in memory_b:
            return False
        ticks, exit_ns = gone
        return (t_ns - exit_ns <= LAST_SAMPLE_AFTER_EXIT_NS
                and self._start_ticks(pid) in (None, ticks))

    def _exit(self, pid: int, t_ns: int) -> Marker:
        ticks = self.known.pop(pid)
        self.left[pid] = (ticks, t_ns)
        return Marker(t_ns, "process-exit", "point", self.source_id,
                      {"gpu": self.gpu, "pid": pid, "start_ticks": ticks})


def identity_sources(driver: Any, gpu: int, *, proc: Path = PROC, pods: Path = PODS,
                     cmdlines: bool = False) -> tuple[Identify, StartTicks]:
    """Who a host pid on ``gpu`` is, and its start time (to see a reused pid).

    From ``proc`` (and the kubelet's ``pods`` folders), unless the NVML library is the
    simulator, which says itself who its processes are (``wattlab_process_identity``).
    """
    simulator = getattr(getattr(driver, "lib", None), "wattlab_process_identity", None)
    if simulator is None:
        return (partial(identify, proc=proc, pods=pods, cmdlines=cmdlines),
                partial(start_ticks, proc=proc))

    def simulated(pid: int) -> dict[str, Any]:
        found = simulator(gpu, pid)
        return {**found, **cgroup_fields(found.get("cgroup"))} if found else {}

    return simulated, lambda pid: simulated(pid).get("start_ticks")


class ProcessReader:
    """Reads one GPU's per-process answers through its driver into a ``ProcessStream``.

    A read that fails after the stream was opened is a Gap with NVML's error as its reason
    (from the last good read to now); the next read tries again. The identity comes from
    ``proc`` (and the kubelet's ``pods`` folders) unless the NVML library is the simulator,
    which says itself who its processes are (``wattlab_process_identity``) and what their
    true energy was (``wattlab_simulated_truth``: the ``simulated-truth`` marker).
    """

    def __init__(self, driver: Any, gpu: int, source_id: str, *, t_ns: int,
                 unix_minus_monotonic_ns: int, cmdlines: bool = False,
                 proc: Path = PROC, pods: Path = PODS) -> None:
        self.driver, self.gpu, self.offset_ns = driver, gpu, unix_minus_monotonic_ns
        self._sim_truth = getattr(getattr(driver, "lib", None), "wattlab_simulated_truth", None)
        who, ticks = identity_sources(driver, gpu, proc=proc, pods=pods, cmdlines=cmdlines)
        self.stream = ProcessStream(gpu, source_id, (t_ns + unix_minus_monotonic_ns) // 1000,
                                    identify=who, start_ticks=ticks,
                                    to_host_ns=lambda us: us * 1000 - unix_minus_monotonic_ns)
        self.open_ns = self.good_ns = t_ns
        self.shared_before = False  # whether the GPU was shared at the read before the last

    def read(self, clock_ns: Callable[[], int]) -> list[Reading]:
        """One read of the driver's per-process answers: rows, markers, or a Gap."""
        t0 = clock_ns()
        shared = len(self.stream.known) >= 2
        try:
            # a GPU shared at either of the last two reads is read again: the samples since
            # are the work of processes that may have left meanwhile, and a process's last
            # sample is stamped up to a driver period after the read that saw it gone (the
            # simulated GPU: a copy's last 0.1 s of work, 25 J, went to the one left)
            samples, memory_b = self.driver.read_processes(
                self.gpu, self.stream.last_seen_us,
                shared_from=0 if shared or self.shared_before else 2)
        except NvmlError as e:
            t1 = clock_ns()
            gap = Gap(self.stream.source_id, str(e), t_first_ns=self.good_ns, t_last_ns=t1)
            self.good_ns = t1
            return [gap]
        t_ns = (t0 + clock_ns()) // 2
        self.good_ns = t_ns
        self.shared_before = shared
        return self.stream.update(samples, memory_b, (t_ns + self.offset_ns) // 1000, t_ns)

    def truth(self, t_ns: int) -> list[Reading]:
        """The simulator's ``simulated-truth`` marker from open to ``t_ns`` (none if real)."""
        payload = None if self._sim_truth is None else self._sim_truth(self.gpu, self.open_ns,
                                                                        t_ns)
        if payload is None:
            return []
        return [Marker(t_ns, "simulated-truth", "point", self.stream.source_id,
                       {"gpu": self.gpu, **payload})]
