"""A GPU's per-process stream as the attribution reads it: who, when, and how active.

Reads ``gpu{i}.processes`` (docs/processes.md), or ``NODE.gpu{i}.processes`` on a
multi-node run (each agent's streams carry its node's prefix): one row per process per
driver utilisation sample. A row describes the interval from the GPU's previous sample
timestamp to its own (the driver's period, taken from the data: the first timestamp has
none and is left out).
While one process is alone on the GPU the stream may hold no rows of it (the recorder
reads the per-process utilisation, 1.9 ms of CPU a call, only while two or more share the
GPU): its activity then is the device's own utilisation (``{prefix}.state``,
``gpu_util_pct``), each state reading over the time nearer to it than to the readings
beside it, cut where processes came or went (docs/process-energy.md). Runs with rows
while alone keep them.
Rows of pid P belong to the latest ``process`` marker of P at or before them, so a reused
pid is another process. A process is *present* from its ``process`` marker to its
``process-exit`` marker (else the stream's end): it holds a context on the GPU then.

A MIG GPU's ``gpu{i}.mig`` stream (``read_instances``) gives the same table with GPU
instances in the processes' place: each instance's GPM activity, as a share of the
partitioned SMs, and its presence where it held a compute process.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from wattlab.analysis.attribution.core import FloatArray
from wattlab.analysis.attribution.learn import free_stretches
from wattlab.runfile import Run

IDENTITY_KEYS = ("gpu", "pid", "start_ticks", "local_pid", "comm", "user", "cgroup",
                 "container_id", "pod_uid", "pod_name", "pod_namespace", "slurm_job",
                 "slurm_step", "cmdline")


@dataclass
class Process:
    """One process on one GPU: its identity, presence and utilisation samples (fractions)."""

    key: str  # unique in the run: node, gpu, pid and the n-th process of that pid
    identity: dict[str, Any]
    present_s: tuple[float, float]
    t0_s: list[float] = field(default_factory=list)  # each sample's interval
    t1_s: list[float] = field(default_factory=list)
    sm: list[float] = field(default_factory=list)  # 0..1 (none given: 0, counted in notes)
    mem: list[float] = field(default_factory=list)
    # intervals whose activity is the device's utilisation (alone, no rows of its own): on
    # another scale than the driver's per-process SM figure, so no weight is learnt there
    from_device: set[tuple[float, float]] = field(default_factory=set)
    exited: bool = False  # a ``process-exit`` marker ended its presence (else the stream's end)

    @property
    def label(self) -> str:
        device = gpu_prefix(self.identity.get("node") or "", self.identity["gpu"])
        if "gi" in self.identity:
            return f"{device}:gi{self.identity['gi']} {self.identity['profile']}"
        comm = self.identity.get("comm")
        return f"{device}:{self.identity['pid']}" + (f" {comm}" if comm else "")

    @property
    def active(self) -> bool:
        """Whether any sample shows work (a process that only holds memory does not)."""
        return bool(sum(self.sm) + sum(self.mem) > 0)


@dataclass
class ProcessTable:
    """Every process of one GPU's stream, with the stream's span and its gaps."""

    gpu: int
    source: str
    processes: list[Process]
    span_s: tuple[float, float]
    gaps: list[str]
    notes: list[str]
    # how far a presence edge may be off: half the running list's read step (0: exact)
    edge_s: float = 0.0
    node: str = ""  # the streams' node prefix on a multi-node run ("" on one host)
    # the window the rule averages activity over (None: its own, for sampled utilisation);
    # a MIG instance's rows are exact means over their read step: that step
    window_s: float | None = None
    # the per-process stream's steps between driver samples that came later than its read
    # cadence allows (``late_steps``), and that cadence (s); none on a MIG GPU: GPM's rows
    # cover the whole time since the previous read, however late
    late_s: list[tuple[float, float]] = field(default_factory=list)
    read_step_s: float = 0.0

    @property
    def prefix(self) -> str:
        return gpu_prefix(self.node, self.gpu)


def gpu_prefix(node: str, gpu: int) -> str:
    """A GPU's stream prefix: ``gpu0`` on one host, ``node1.gpu0`` on a multi-node run."""
    return f"{node}.gpu{gpu}" if node else f"gpu{gpu}"


def missing_reason(run: Run, gpu: int, node: str = "") -> str:
    """Why a run has no per-process stream of ``gpu`` (of ``node``: a multi-node run).

    The acquirer's own words where it gave them.
    """
    prefix = gpu_prefix(node, gpu)
    for sid, view in run.sources.items():
        if not sid.startswith(f"{prefix}."):
            continue
        why = (view.descriptor.get("config") or {}).get("missing", {}).get("processes")
        if why:
            return f"{prefix}: the driver refused the per-process query: {why}"
    return (f"{prefix}: no {prefix}.processes stream in {run.path} (recorded before "
            "per-process recording existed, or with it off)")


def list_read_step_s(run: Run, prefix: str, view: Any) -> float:
    """How often the running-process list was read: at every read of the processes stream.

    Its cadence in the stream's descriptor (``--nvml-intervals processes=S``); a run from
    before the stream had a cadence of its own read it with the state readings (their
    step). 0 where neither tells (the markers are then taken as exact).
    """
    intervals = (view.descriptor.get("config") or {}).get("intervals_s") or {}
    if isinstance(intervals.get("processes"), int | float) and intervals["processes"] > 0:
        return float(intervals["processes"])
    sid = f"{prefix}.state"
    if sid in run.sources:
        t = np.asarray(run.source(sid).time_s, dtype=np.float64)
        if t.size > 2:
            return float(np.median(np.diff(t)))
    return 0.0


def gpu_stream(run: Run, gpu: int, node: str, kind: str
               ) -> tuple[str, str, Any, FloatArray] | None:
    """A GPU's ``{prefix}.{kind}`` stream: (prefix, stream id, view, times s); None: none."""
    prefix = gpu_prefix(node, gpu)
    sid = f"{prefix}.{kind}"
    if sid not in run.sources:
        return None
    view = run.source(sid)
    return prefix, sid, view, np.asarray(view.time_s, dtype=np.float64)


def read_processes(run: Run, gpu: int, node: str = "",
                   place: Callable[[list[Process]], int] | None = None) -> ProcessTable | None:
    """The processes of ``gpu`` (module doc); None where the run has no such stream.

    ``node``: a multi-node run's GPU (``NODE.gpu{i}.processes``); each process's identity
    (``node``), key and label then carry the node, so two nodes' pids never meet.
    ``place``: moves presence edges before the rows are assigned (``place_lone_edges``),
    and says how many it moved.
    """
    found = gpu_stream(run, gpu, node, "processes")
    if found is None:
        return None
    prefix, sid, view, t = found
    pid = np.asarray(view.channel("pid"), dtype=np.float64)
    sm = np.asarray(view.channel("sm_util_pct"), dtype=np.float64) / 100.0
    mem = np.asarray(view.channel("mem_util_pct"), dtype=np.float64) / 100.0
    marks = sorted((m for m in run.markers if m.source == sid
                    and m.name in ("process", "process-exit")), key=lambda m: m.time_ns)
    end_s = float(t.max()) if t.size else 0.0
    procs: list[Process] = []
    latest: dict[int, Process] = {}
    seen: dict[int, int] = {}
    # a marker is stamped at the read that first (or no longer) saw the process: the change
    # happened in the read interval before it, half a step earlier on average
    half_step_s = list_read_step_s(run, prefix, view) / 2
    for m in marks:
        at_s = m.time_ns / 1e9 - half_step_s  # the streams' clock: session ns
        p = int(m.payload.get("pid", -1))
        if m.name == "process":
            if p in latest:  # pid reused without an exit marker: the old one ended here
                latest[p].present_s = (latest[p].present_s[0], at_s)
            seen[p] = seen.get(p, 0) + 1
            ident = {k: m.payload.get(k) for k in IDENTITY_KEYS} | {"gpu": gpu, "pid": p}
            if node:
                ident["node"] = node
            latest[p] = Process(f"{prefix}:{p}" + (f"#{seen[p]}" if seen[p] > 1 else ""),
                                ident, (at_s, end_s))
            procs.append(latest[p])
        elif p in latest:
            latest[p].present_s = (latest[p].present_s[0], at_s)
            latest[p].exited = True
            del latest[p]
    moved = place(procs) if place is not None else 0
    read_step_s = cadence_s(view, t)
    late = late_steps(np.unique(t), [p.present_s for p in procs], read_step_s)
    notes = _assign_rows(procs, t, pid, sm, mem)
    if moved:
        notes.append(f"{moved} presence edge(s) of a process coming or going alone placed where "
                     "the power crossed halfway between idle and static (the marker says only "
                     f"which read of every {2 * half_step_s:.3g} s saw it)")
    notes += _alone_from_device(run, prefix, procs)
    span = (float(t.min()), end_s) if t.size else (0.0, 0.0)
    return ProcessTable(gpu, sid, procs, span, gap_lines(run, sid), notes, half_step_s, node,
                        late_s=late, read_step_s=read_step_s)


# the driver's per-process sampling period (H100, H200: ~6 a second, docs/processes.md): a
# read on time answers a sample of at most this long before it, so two reads' newest
# samples may lie a cadence and this much apart without either read being late
DRIVER_PERIOD_S = 1 / 6


def cadence_s(view: Any, t_s: FloatArray) -> float:
    """How often the per-process utilisation was meant to be read (s).

    The reader's ``processes`` cadence in the descriptor (``--nvml-intervals``); a run from
    before it had one read it with the state readings (``state``); a stream without either
    (written by another tool) its own median step between samples.
    """
    intervals = (view.descriptor.get("config") or {}).get("intervals_s") or {}
    for key in ("processes", "state"):
        if isinstance(intervals.get(key), int | float) and intervals[key] > 0:
            return float(intervals[key])
    stamps = np.unique(t_s)
    return float(np.median(np.diff(stamps))) if stamps.size > 2 else 0.0


def late_steps(stamps_s: FloatArray, present: list[tuple[float, float]], cadence: float
               ) -> list[tuple[float, float]]:
    """Steps between the stream's samples longer than a read on time leaves (doc).

    Only while two or more processes were present throughout the step: the recorder reads
    the per-process utilisation then (alone, or with none, the stream is quiet by design).
    On time, the newest samples of two reads lie at most ``cadence + DRIVER_PERIOD_S``
    apart; a longer step is a late read (a loaded host), and the driver answers only its
    newest sample per process: the samples between were never read.
    """
    if cadence <= 0 or stamps_s.size < 2:
        return []
    edges = sorted({e for span in present for e in span})
    out = []
    for a, b in zip(stamps_s[:-1].tolist(), stamps_s[1:].tolist(), strict=True):
        if b - a <= cadence + DRIVER_PERIOD_S:
            continue
        cuts = [a, *(e for e in edges if a < e < b), b]
        if all(sum(x <= (c + d) / 2 < y for x, y in present) >= 2
               for c, d in pairwise(cuts)):
            out.append((a, b))
    return out


def gap_lines(run: Run, sid: str) -> list[str]:
    """Each gap row of stream ``sid``: its reason and span (s)."""
    return [f"{g.reason} ({'?' if g.time_first_ns is None else g.time_first_ns / 1e9:.6g}"
            f"–{'?' if g.time_last_ns is None else g.time_last_ns / 1e9:.6g} s)"
            for g in run.gaps if g.source == sid]


def read_instances(run: Run, gpu: int, node: str = "") -> ProcessTable | None:
    """A MIG GPU's instances as a table (module doc); None where the run has no such stream.

    A row covers the time since the instance's previous row (the first, whose start is
    not recorded, is left out). An instance is present over each stretch of reads that
    found a process in it, from half a read step before the first such read to half a step
    before the first read that found none; one entry per stretch.
    """
    found = gpu_stream(run, gpu, node, "mig")
    if found is None:
        return None
    prefix, sid, view, t = found
    column = {c: np.asarray(view.channel(c), dtype=np.float64)
              for c in ("gi", "sm_util_pct", "dram_bw_util_pct", "processes")}
    instances = view.descriptor["config"]["instances"]
    all_sms = sum(i["sm_count"] for i in instances)
    stamps = np.unique(t)
    half_s = float(np.median(np.diff(stamps))) / 2 if stamps.size > 1 else 0.0
    end_s = float(t.max()) if t.size else 0.0
    table = []
    for inst in instances:
        rows = column["gi"] == inst["gi"]
        ti, busy = t[rows], np.nan_to_num(column["processes"][rows]) > 0
        share = inst["sm_count"] / all_sms
        sm = np.nan_to_num(column["sm_util_pct"][rows]) / 100 * share
        mem = np.nan_to_num(column["dram_bw_util_pct"][rows]) / 100 * share
        starts = np.flatnonzero(busy & ~np.concatenate(([False], busy[:-1])))
        ends = np.flatnonzero(~busy & np.concatenate(([False], busy[:-1])))
        spans = [(float(ti[a]) - half_s, next((float(ti[e]) - half_s for e in ends if e > a),
                                              end_s)) for a in starts]
        made = [Process(f"{prefix}:gi{inst['gi']}" + (f"#{k + 1}" if k else ""),
                        {"gpu": gpu, **({"node": node} if node else {}), **inst}, span)
                for k, span in enumerate(spans)]
        for a, b, s, m in zip(ti[:-1].tolist(), ti[1:].tolist(), sm[1:].tolist(),
                              mem[1:].tolist(), strict=True):
            owner = [p for p in made if p.present_s[0] < b] or made[:1]
            if owner:
                p = owner[-1]
                p.t0_s.append(a)
                p.t1_s.append(b)
                p.sm.append(s)
                p.mem.append(m)
        table += made
    notes = [f"MIG: {len(instances)} GPU instance(s); activity is GPM's SM and DRAM-bandwidth "
             f"utilisation of each, weighted by its share of the {all_sms} partitioned SMs"]
    notes += _instance_owners(run, sid, table)
    return ProcessTable(gpu, sid, table, (float(t.min()) if t.size else 0.0, end_s),
                        gap_lines(run, sid), notes, half_s, node, 2 * half_s or None)


OWNER_KEYS = ("user", "container_id", "pod_uid", "pod_name", "pod_namespace", "slurm_job",
              "slurm_step")
"""What an instance inherits from the processes that ran in it (for --by-job, --by-pod)."""


def _instance_owners(run: Run, sid: str, instances: list[Process]) -> list[str]:
    """Each instance stretch named after the processes seen in it (notes where they differ).

    The MIG stream's ``process`` markers carry each process's identity and instance
    (``gi``); a stretch whose processes all share a job (a pod, a user) is that job's; one
    whose processes belong to several is charged to none of them, and a note says so: the
    driver gives no per-process activity inside an instance to split it by.
    """
    marks = [m for m in run.markers if m.source == sid and m.name == "process"]
    notes = []
    for inst in instances:
        a, b = inst.present_s
        seen = [m.payload for m in marks if m.payload.get("gi") == inst.identity["gi"]
                and a <= m.time_ns / 1e9 <= b]
        inst.identity["pids"] = sorted({int(p["pid"]) for p in seen})
        for key in OWNER_KEYS:
            values = {p.get(key) for p in seen}
            inst.identity[key] = next(iter(values)) if len(values) == 1 else None
            if len(values) > 1 and key in ("slurm_job", "pod_uid"):
                names = ", ".join(sorted(map(str, values)))
                notes.append(f"{inst.label}: processes of several {key}s ran in it ({names}): "
                             "its energy is charged to none of them")
    return notes


DEVICE_UTIL = "gpu_util_pct"  # the state stream's channel: the device's SM utilisation
FILL_MIN_S = 1e-3  # a lone stretch between rows shorter than this is the stamps' rounding


def _alone_from_device(run: Run, prefix: str, procs: list[Process]) -> list[str]:
    """Rows from the device's utilisation where one process was alone and has none (doc)."""
    sid = f"{prefix}.state"
    if sid not in run.sources:
        return []
    view = run.source(sid)
    if DEVICE_UTIL not in view.channel_names:
        return []
    t = np.asarray(view.time_s, dtype=np.float64)
    util = np.asarray(view.channel(DEVICE_UTIL), dtype=np.float64) / 100.0
    # each reading is the driver's latest sample, a fraction of the read step before it:
    # it stands for the time nearer to it than to its neighbours (half a step each side)
    mids = (t[:-1] + t[1:]) / 2
    lo_s = np.concatenate(([t[0] - (mids[0] - t[0]) if mids.size else t[0]], mids))
    hi_s = np.concatenate((mids, [t[-1] + (t[-1] - mids[-1]) if mids.size else t[-1]]))
    edges = sorted({e for p in procs for e in p.present_s})
    added = 0
    for a, b, u in zip(lo_s.tolist(), hi_s.tolist(), util.tolist(), strict=True):
        if not math.isfinite(u):
            continue
        # the reading's time cut where processes came or went: a part with one process
        # present is that process's alone; the device worked only while some were present
        cuts = [a, *(e for e in edges if a < e < b), b]
        parts = [(c, d, [p for p in procs if p.present_s[0] <= (c + d) / 2 < p.present_s[1]])
                 for c, d in pairwise(cuts)]
        present_s = sum(d - c for c, d, here in parts if here)
        for c, d, here in parts:
            if len(here) != 1 or d <= c:
                continue
            p = here[0]
            # only where the stream has no rows of its own: a lone stretch its last driver
            # rows reach into is filled after them (the simulated GPU: 26 J went to no
            # process where a read's part was skipped whole)
            for lo, hi in free_stretches(list(zip(p.t0_s, p.t1_s, strict=True)), c, d):
                if hi - lo < FILL_MIN_S:
                    continue
                at = int(np.searchsorted(p.t1_s, hi))
                p.t0_s.insert(at, lo)
                p.t1_s.insert(at, hi)
                p.sm.insert(at, min(1.0, u * (b - a) / present_s))
                p.mem.insert(at, 0.0)
                p.from_device.add((lo, hi))
                added += 1
    return [f"{added} interval(s) of a process alone without rows of its own: its activity "
            f"taken from {sid}:{DEVICE_UTIL} (the device's utilisation; memory activity "
            "unknown there, 0)"] if added else []


def _interval_starts(stamps: FloatArray, first: bool = False) -> dict[float, float]:
    """Where each stamp's interval starts.

    The stamp before, or one median step back where the step before is longer (a quiet
    spell). The first stamp has none, unless ``first``: then one median step back (the driver's
    first sample after the reader's zero rows covers its period, as every other does).
    """
    period_s = float(np.median(np.diff(stamps))) if stamps.size > 2 else math.inf
    before = np.concatenate(([-math.inf], stamps[:-1])) if stamps.size else stamps
    starts = np.maximum(before, stamps - period_s)
    keep = np.isfinite(starts) & (first | (np.arange(stamps.size) > 0))
    return dict(zip(stamps[keep].tolist(), starts[keep].tolist(), strict=True))


def _assign_rows(procs: list[Process], t: FloatArray, pid: FloatArray, sm: FloatArray,
                 mem: FloatArray) -> list[str]:
    """Each row to its process, over the interval since the GPU's previous timestamp.

    At most one driver sampling period (the median step between the stream's timestamps)
    long: the driver names no process while none is active, so the first sample after a
    quiet spell would otherwise spread its activity over the whole spell. A driver sample's
    interval is measured between the driver's own stamps: the reader's zero rows (a process
    that held the GPU without a sample, stamped at the read) are not the driver's, and read
    every 0.15 s they cut each sample's interval to the few ms since the last read
    (the simulated GPU: 11 s of 25 s of work had no row, 132 J went to no process).
    """
    unknown = int(np.sum(~np.isfinite(sm) | ~np.isfinite(mem)))
    sm, mem = np.nan_to_num(sm, nan=0.0), np.nan_to_num(mem, nan=0.0)
    driver = sm + mem > 0
    prev = _interval_starts(np.unique(t))
    prev_driver = _interval_starts(np.unique(t[driver]), first=not driver.all())
    by_pid: dict[int, list[Process]] = {}
    for p in procs:
        by_pid.setdefault(int(p.identity["pid"]), []).append(p)
    orphans = 0
    rows: dict[int, list[tuple[float, float, float, float, bool]]] = {}
    for ti, pi, si, mi, di in zip(t.tolist(), pid.tolist(), sm.tolist(), mem.tolist(),
                                  driver.tolist(), strict=True):
        owner = [p for p in by_pid.get(int(pi), []) if p.present_s[0] <= ti]
        if not owner:
            orphans += 1
            continue
        start = (prev_driver if di else prev).get(ti)
        if start is None:
            continue  # the first sample: its interval started before the stream did
        rows.setdefault(id(owner[-1]), []).append((start, ti, si, mi, di))
    hidden = 0
    for p in procs:
        kept = _zero_rows_off_samples(rows.get(id(p), []))
        hidden += len(rows.get(id(p), [])) - len(kept)
        p.t0_s, p.t1_s, p.sm, p.mem = ([r[k] for r in kept] for k in range(4))
    notes = [f"{orphans} row(s) of a pid with no earlier 'process' marker: left out"
             ] if orphans else []
    if hidden:
        notes.append(f"{hidden} zero row(s) inside a driver sample of the same process left "
                     "out (read again before the driver's next sample: no news, not idle)")
    if unknown:
        notes.append(f"{unknown} row(s) without SM or memory utilisation from the driver: "
                     "counted as no activity there")
    return notes


def _zero_rows_off_samples(rows: list[tuple[float, float, float, float, bool]]
                           ) -> list[tuple[float, float, float, float, bool]]:
    """A process's rows without the reader's zero rows that lie inside its driver samples.

    A zero row says the read found no sample of the process newer than the last; read
    faster than the driver samples (every 0.15 s against ~1/6 s), that is often only "no
    sample yet", and the driver's next sample covers the same time with the work it saw:
    averaged with it, the zero diluted a working process's activity (the simulated GPU: a
    small-kernel process 2 % low).
    """
    spans = sorted((a, b) for a, b, *_, driver in rows if driver)
    if not spans:
        return rows
    starts = np.array([a for a, _ in spans])
    ends = np.maximum.accumulate(np.array([b for _, b in spans]))
    kept = []
    for row in rows:
        a, b, *_, driver = row
        i = int(np.searchsorted(starts, b, "left")) - 1  # the last sample starting before b
        if driver or i < 0 or ends[i] <= a:
            kept.append(row)
    return kept
