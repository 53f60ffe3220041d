"""Shared-GPU run files whose truth is known, written offline in the per-process stream's format.

The GPU's power is idle, plus static while any process holds a context, plus each working
process's ``W_SM * sm + W_MEM * mem`` (additive: the activity rule can be exact, Kepler's
cannot, as the processes mix SM and memory work differently). The per-process stream is
written as docs/processes.md and the issue 41 contract say: one row per present process
per driver sample (every 1/6 s), 0 for a present process without work, identity markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor

UNIX0_NS = 1_800_000_000_000_000_000
IDLE_W, STATIC_W, W_SM, W_MEM = 60.0, 20.0, 300.0, 200.0
DURATION_S = 20.0
PERIOD_S = 1 / 6  # the driver's utilisation sample period
PROCESS_CHANNELS = (Channel("pid", "1"), Channel("sm_util_pct", "%"),
                    Channel("mem_util_pct", "%"), Channel("enc_util_pct", "%"),
                    Channel("dec_util_pct", "%"), Channel("used_memory_b", "B"))


@dataclass(frozen=True)
class Proc:
    pid: int
    present: tuple[float, float]
    active: tuple[float, float] | None  # where it works (None: it only holds memory)
    sm: float = 0.0
    mem: float = 0.0
    identity: dict[str, Any] = field(default_factory=dict)

    def dynamic_w(self) -> float:
        return W_SM * self.sm + W_MEM * self.mem

    def truth_j(self, window: tuple[float, float] = (0.0, DURATION_S)) -> float:
        if self.active is None:
            return 0.0
        a, b = max(self.active[0], window[0]), min(self.active[1], window[1])
        return self.dynamic_w() * max(b - a, 0.0)


PROCS = [
    Proc(101, (2.0, 16.0), (3.0, 10.0), 0.9, 0.2,
         {"comm": "train", "user": "ana", "slurm_job": "4711", "pod_uid": "pod-a",
          "pod_name": "trainer-0", "pod_namespace": "ml"}),
    Proc(202, (5.0, 18.0), (6.0, 14.0), 0.4, 0.8,
         {"comm": "etl", "user": "bo", "slurm_job": "4712"}),
    Proc(303, (4.0, 17.0), None, identity={"comm": "holder", "user": "cy"}),
]


def true_power_w(t_s: np.ndarray, procs: list[Proc]) -> np.ndarray:
    p = np.full(t_s.shape, IDLE_W)
    present = np.zeros(t_s.shape, bool)
    for q in procs:
        present |= (t_s >= q.present[0]) & (t_s < q.present[1])
        if q.active is not None:
            p += q.dynamic_w() * ((t_s >= q.active[0]) & (t_s < q.active[1]))
    return p + STATIC_W * present


def identity(q: Proc, gpu: int) -> dict[str, Any]:
    keys = ("start_ticks", "local_pid", "comm", "user", "cgroup", "container_id", "pod_uid",
            "pod_name", "pod_namespace", "slurm_job", "slurm_step", "cmdline")
    return {"gpu": gpu, "pid": q.pid} | dict.fromkeys(keys) | q.identity


def write_shared_run(path: Path, *, procs: list[Proc] | None = None, processes: bool = True,
                     missing: str | None = None, gap_s: tuple[float, float] | None = None,
                     counter_gain: float = 1.0, truth: bool = False,
                     gpus: tuple[int, ...] = (0,), nodes: tuple[str, ...] = ("",)) -> Path:
    """The run (module doc). ``processes=False``: no per-process stream (``missing``: the
    acquirer's reason in ``config["missing"]``); ``gap_s``: the per-process query failed then;
    ``truth``: the simulated GPU's ``simulated-truth`` marker at the end; ``gpus``: each of
    these GPUs runs the same processes (one process across several GPUs); ``nodes``: each
    of these nodes has those GPUs, its streams named ``NODE.gpu{i}.*`` as a multi-node
    (Slurm/agent) run names them ("": one host, ``gpu{i}.*``).
    """
    procs = PROCS if procs is None else procs
    w = RunFileWriter(str(path), {"created": "test", "session_start_unix_ns": UNIX0_NS}, 0)
    config = {"missing": {"processes": missing} if missing else {}}
    for node in nodes:
        for gpu in gpus:
            write_gpu(w, gpu, procs, config, counter_gain, node)
            if processes:
                write_processes(w, procs, gap_s, gpu, node)
    if truth:
        end_ns = round(DURATION_S * 1e9)
        w.add_markers([Marker(end_ns, "simulated-truth", "point",
                              f"{prefix(nodes[0], 0)}.processes", {
            "gpu": 0, "window_ns": [0, end_ns], "idle_j": IDLE_W * DURATION_S,
            "static_j": STATIC_W * 16.0, "dynamic_j": {str(q.pid): q.truth_j() for q in procs}})])
    w.close()
    return path


def prefix(node: str, gpu: int) -> str:
    return f"{node}.gpu{gpu}" if node else f"gpu{gpu}"


def write_gpu(w: RunFileWriter, gpu: int, procs: list[Proc], config: dict[str, Any],
              counter_gain: float, node: str = "") -> None:
    """One GPU's 50 Hz power samples and its energy counter (read every second)."""
    device = prefix(node, gpu)
    w.add_source(SourceDescriptor(f"{device}.samples", "nvml", "sim", (Channel(
        "power_w", "W", "nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)"),), config=config))
    w.add_source(SourceDescriptor(f"{device}.energy", "nvml", "sim", (Channel(
        "energy_j", "J", "nvmlDeviceGetTotalEnergyConsumption"),), config=config))
    t = np.arange(0, int(DURATION_S * 50) + 1) * 20_000_000
    p = true_power_w(t / 1e9, procs)
    w.append(f"{device}.samples", t, t, p.reshape(-1, 1), np.zeros(t.size, np.uint8))
    te = np.arange(0, int(DURATION_S) + 1) * 1_000_000_000
    cum = np.concatenate(([0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * 0.02)))
    e = 5e6 + counter_gain * cum[(te // 20_000_000).astype(int)]
    w.append(f"{device}.energy", te, te, e.reshape(-1, 1), np.zeros(te.size, np.uint8))


def write_processes(w: RunFileWriter, procs: list[Proc], gap_s: tuple[float, float] | None,
                    gpu: int = 0, node: str = "") -> None:
    sid = f"{prefix(node, gpu)}.processes"
    w.add_source(SourceDescriptor(sid, "nvml", "sim", PROCESS_CHANNELS,
                                  time_raw="device_unix_us"))
    stamps = np.arange(1, int(DURATION_S / PERIOD_S) + 1) * PERIOD_S
    rows = []
    for ts in stamps:
        if gap_s and gap_s[0] <= ts <= gap_s[1]:
            continue
        for q in procs:
            mid = ts - PERIOD_S / 2  # the interval this sample describes
            if not q.present[0] <= mid < q.present[1]:
                continue
            on = q.active is not None and q.active[0] <= mid < q.active[1]
            rows.append((ts, q.pid, 100 * q.sm if on else 0.0, 100 * q.mem if on else 0.0))
    t_ns = np.array([round(r[0] * 1e9) for r in rows], np.int64)
    values = np.array([[r[1], r[2], r[3], np.nan, np.nan, 1e9] for r in rows], np.float64)
    w.append(sid, t_ns, UNIX0_NS // 1000 + t_ns // 1000, values,
             np.zeros(t_ns.size, np.uint8))
    marks = [Marker(round(q.present[0] * 1e9), "process", "point", sid,
                    identity(q, gpu)) for q in procs]
    marks += [Marker(round(q.present[1] * 1e9), "process-exit", "point", sid,
                     {"gpu": gpu, "pid": q.pid, "start_ticks": None}) for q in procs
              if q.present[1] < DURATION_S]
    w.add_markers(sorted(marks, key=lambda m: m.t_host_ns))
    if gap_s:
        w.add_gaps([Gap(sid, "NVML_ERROR_UNKNOWN", t_first_ns=round(gap_s[0] * 1e9),
                        t_last_ns=round(gap_s[1] * 1e9))])


# A second node: pid 101 again (another host's process), a third job, job 4711 on both
NODE1 = [Proc(101, (1.0, 12.0), (2.0, 11.0), 0.3, 0.6, {"comm": "infer", "slurm_job": "4713"}),
         Proc(505, (3.0, 19.0), (4.0, 9.0), 0.8, 0.0, {"comm": "train", "slurm_job": "4711"})]
NODE1_GAIN = 1.02  # node1's counter reads 2 % above its power: its split follows its counter


def write_two_nodes(path: Path, *, node1_processes: bool = True) -> Path:
    """A multi-node run: node0 runs PROCS, node1 runs NODE1 (its per-process stream
    optional), streams named ``node0.gpu0.*`` and ``node1.gpu0.*`` as `wattlab slurm` names
    them."""
    w = RunFileWriter(str(path), {"created": "test", "session_start_unix_ns": UNIX0_NS}, 0)
    config: dict[str, Any] = {"missing": {}}
    write_gpu(w, 0, PROCS, config, 1.0, "node0")
    write_processes(w, PROCS, None, 0, "node0")
    write_gpu(w, 0, NODE1, config, NODE1_GAIN, "node1")
    if node1_processes:
        write_processes(w, NODE1, None, 0, "node1")
    w.close()
    return path
