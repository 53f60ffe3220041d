"""A simulated GPU shared by several processes, with each one's true energy known.

Why: attributing a shared GPU's energy to its processes (issue 41) must be scored against a
truth, and no real card gives one. The physics here is not an attribution rule run
backwards (docs/processes.md, "The simulated shared GPU"):

- each process runs phases of work; a phase draws ``power_w`` of dynamic power when it runs
  alone, with the SM and memory utilisation the driver would report of it alone;
- any live context costs ``static_w`` (a context alive without kernels is not free), shared
  by all contexts, once, above the card's idle;
- overlapping processes saturate: the sum of what they would draw alone is compressed toward
  ``limit_w`` above ``knee_w`` (the card runs out of power and bandwidth);
- the driver's per-process samples come every ~1/6 s with jitter; overlapping processes
  time-slice the GPU, so each one's SM and memory percentages shrink by one common share
  where either sum would pass 100 %.

Truth over a window, per segment where nothing changes: the GPU's true energy minus
``idle_w`` is static and dynamic; with no live context everything is idle, with contexts but
no work the rest is static, and with work the rest after static is split among the working
processes in proportion to what each would draw alone.

Under MIG (``MigLoad``) each process runs in a GPU instance with its own SMs and memory
slice: no time-slicing across instances, the driver gives no per-process utilisation, and
an instance's activity is its GPM SM and DRAM-bandwidth utilisation (of its own share).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from wattlab.device_models import Segment, WorkloadSchedule

if TYPE_CHECKING:
    from collections.abc import Callable

    from wattlab.hardware.fake_nvml import FakeNvml
    from wattlab.hardware.simulated_gpu import SimulatedGpu

UTIL_PERIOD_S = 1 / 6  # the driver's per-process sampling period on H100/H200
UTIL_JITTER_S = 0.004
UTIL_HISTORY = 100  # samples the driver keeps (~16 s)
# no context for the first seconds: a recording started with the GPU is up by then, and
# measures the card's idle power before any process starts
IDLE_LEAD_S = 3.0


@dataclass(frozen=True)
class Phase:
    """A stretch of one process's work: its utilisation and the dynamic power it draws alone."""

    duration_s: float
    sm_pct: float = 0.0
    mem_pct: float = 0.0
    power_w: float = 0.0


@dataclass(frozen=True)
class SimProcess:
    """A process with a context on the GPU from ``start_s`` (after the GPU's start) on."""

    pid: int
    comm: str
    start_s: float
    phases: tuple[Phase, ...]
    used_memory_b: int = 2 << 30
    user: str = "sim"
    start_ticks: int = 0
    cgroup: str | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + sum(p.duration_s for p in self.phases)

    def phase_at(self, t_s: float) -> Phase | None:
        """The phase running at ``t_s``; None outside the process's life."""
        if t_s < self.start_s:
            return None
        left = t_s - self.start_s
        for phase in self.phases:
            if left < phase.duration_s:
                return phase
            left -= phase.duration_s
        return None


class SharedLoad:
    """Processes sharing one simulated GPU: its busy schedule, their samples, the truth."""

    def __init__(self, processes: list[SimProcess], *, idle_w: float, dynamic_w: float,
                 static_w: float = 35.0, knee_w: float = 300.0, limit_w: float = 450.0,
                 seed: int = 0) -> None:
        self.processes = processes
        self.idle_w, self.dynamic_w = idle_w, dynamic_w
        self.static_w, self.knee_w, self.limit_w = static_w, knee_w, limit_w
        self.seed = seed
        edges = {0.0} | {p.start_s for p in processes} | {p.end_s for p in processes}
        for p in processes:
            t = p.start_s
            for phase in p.phases:
                t += phase.duration_s
                edges.add(t)
        self.edges_s = np.array(sorted(edges))
        mids = (self.edges_s[:-1] + self.edges_s[1:]) / 2
        phases = [[p.phase_at(float(m)) for p in processes] for m in mids]
        self.alive = np.array([[ph is not None for ph in row] for row in phases], dtype=bool)
        self.alone_w = np.array([[ph.power_w if ph else 0.0 for ph in row] for row in phases])
        self.sm_pct = np.array([[ph.sm_pct if ph else 0.0 for ph in row] for row in phases])
        self.mem_pct = np.array([[ph.mem_pct if ph else 0.0 for ph in row] for row in phases])

    def saturated_w(self, alone_sum_w: float) -> float:
        """Dynamic power drawn when processes that would draw ``alone_sum_w`` alone overlap."""
        over = alone_sum_w - self.knee_w
        if over <= 0:
            return alone_sum_w
        room = self.limit_w - self.knee_w
        return self.knee_w + room * (1.0 - math.exp(-over / room))

    def schedule(self) -> WorkloadSchedule:
        """The GPU's busyness: static and saturated dynamic power as a share of ``dynamic_w``."""
        segs = []
        for j in range(len(self.edges_s) - 1):
            above_w = (self.static_w * self.alive[j].any()
                       + self.saturated_w(float(self.alone_w[j].sum())))
            segs.append(Segment(float(self.edges_s[j + 1] - self.edges_s[j]),
                                min(1.0, above_w / self.dynamic_w), "shared"))
        return WorkloadSchedule(segs)

    # ------------------------------------------------------------------ the driver's views

    def running(self, t_s: float) -> list[SimProcess]:
        """Processes with a live context at ``t_s`` (seconds after the GPU's start)."""
        return [p for p in self.processes if p.start_s <= t_s < p.end_s]

    def sample_times_s(self, k: np.ndarray) -> np.ndarray:
        """When the driver takes its k-th per-process sample (s after the GPU's start)."""
        rng = np.random.default_rng([self.seed, 0x5A3])
        offset = float(rng.uniform(0, UTIL_PERIOD_S))
        phase = np.sin(k * 12.9898 + self.seed) * 43758.5453  # a fixed jitter per sample
        jitter = (phase - np.floor(phase) - 0.5) * 2 * UTIL_JITTER_S
        return np.asarray(offset + k * UTIL_PERIOD_S + jitter, dtype=np.float64)

    def _mean_over(self, a_s: float, b_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Each process's mean (SM %, memory %) over [a, b] as the driver sees it shared."""
        last = len(self.edges_s) - 2  # the last segment
        first_k = min(last, max(0, int(np.searchsorted(self.edges_s, a_s, "right")) - 1))
        last_k = min(last, max(0, int(np.searchsorted(self.edges_s, b_s, "right")) - 1))
        touched = slice(first_k, last_k + 1)  # past the last edge nothing runs: weight 0
        lo = np.clip(self.edges_s[:-1][touched], a_s, b_s)
        hi = np.clip(self.edges_s[1:][touched], a_s, b_s)
        w = (hi - lo)[:, None]
        # time-slicing: each process has the GPU a share of the time, the same share for its
        # SM and memory activity, and the shares add up to at most 100 %
        sm, mem = self.sm_pct[touched], self.mem_pct[touched]
        busiest = np.maximum(sm.sum(axis=1), mem.sum(axis=1))[:, None]
        slice_share = np.minimum(1.0, 100.0 / np.maximum(busiest, 1e-9))
        sm, mem = sm * slice_share, mem * slice_share
        span = max(b_s - a_s, 1e-9)
        return (sm * w).sum(axis=0) / span, (mem * w).sum(axis=0) / span

    def utilisation_samples(self, now_s: float, since_s: float
                            ) -> list[tuple[int, float, int, int]]:
        """(pid, stamp s, SM %, memory %) of samples in (since, now], active processes only.

        The driver keeps ``UTIL_HISTORY`` samples and lists a process in a sample only if it
        was active over that sample's period; one call answers one sample per process, its
        newest in (since, now] (NVML: "one utilization sample structure is returned per
        process running"), so a reader slower than the driver's period sees a subsample.
        """
        k_now = math.floor(now_s / UTIL_PERIOD_S) + 1
        ks = np.arange(max(1, k_now - UTIL_HISTORY), k_now + 1)
        stamps = self.sample_times_s(ks)
        ks = ks[(stamps > since_s) & (stamps <= now_s)]
        out = []
        for t, t0 in zip(self.sample_times_s(ks).tolist(), self.sample_times_s(ks - 1).tolist(),
                         strict=True):
            sm, mem = self._mean_over(t0, t)
            for p, s, m in zip(self.processes, sm.tolist(), mem.tolist(), strict=True):
                if round(s) > 0 or round(m) > 0:
                    out.append((p.pid, t, round(s), round(m)))
        newest = {row[0]: row for row in out}  # in time order: the last one of each pid stays
        return sorted(newest.values(), key=lambda row: (row[1], row[0]))

    # ------------------------------------------------------------------ truth

    def truth(self, gpu: SimulatedGpu, t0_ns: int, t1_ns: int) -> dict[str, Any]:
        """Idle, static and each process's dynamic energy (J) over [t0, t1] (host ns)."""
        idle_j = static_j = 0.0
        dynamic = {str(p.pid): 0.0 for p in self.processes}
        start = gpu.start_ns
        cuts = [t0_ns, *(start + round(e * 1e9) for e in self.edges_s), t1_ns]
        cuts = sorted({min(max(c, t0_ns), t1_ns) for c in cuts})
        for a, b in pairwise(cuts):
            mid_s = ((a + b) / 2 - start) / 1e9
            j = int(np.searchsorted(self.edges_s, mid_s, side="right")) - 1
            energy_j, dt_s = gpu.true_energy_j(a, b), (b - a) / 1e9
            inside = 0 <= j < len(self.alive)
            if not inside or not self.alive[j].any():
                idle_j += energy_j
                continue
            idle_j += self.idle_w * dt_s
            alone = self.alone_w[j]
            if alone.sum() <= 0:
                static_j += energy_j - self.idle_w * dt_s
                continue
            static_j += self.static_w * dt_s
            rest = energy_j - (self.idle_w + self.static_w) * dt_s
            for p, share in zip(self.processes, (alone / alone.sum()).tolist(), strict=True):
                dynamic[str(p.pid)] += rest * share
        return {"window_ns": [t0_ns, t1_ns], "idle_j": idle_j, "static_j": static_j,
                "dynamic_j": dynamic}

    def identity(self, pid: int, t_s: float) -> dict[str, Any] | None:
        """The identity a process of this simulation would have (None: no such pid now)."""
        mine = [p for p in self.processes if p.pid == pid and p.start_s <= t_s]
        if not mine:
            return None
        p = max(mine, key=lambda q: q.start_s)  # a reused pid: the latest process
        return {"start_ticks": p.start_ticks, "comm": p.comm, "user": p.user,
                "cgroup": p.cgroup}


# kinds of work: (name, SM %, memory %, W per SM %, W per memory %): power is not utilisation
WORK_KINDS = (("matmul", 70.0, 20.0, 4.0, 0.5), ("copy", 30.0, 60.0, 1.0, 3.0),
              ("smallk", 60.0, 5.0, 1.2, 0.2), ("train", 50.0, 30.0, 2.5, 1.5))


def work_phase(kind: tuple[str, float, float, float, float], duration_s: float,
               scale: float) -> Phase:
    """A phase of this kind of work at ``scale`` of its usual intensity."""
    _, sm, mem, w_sm, w_mem = kind
    sm, mem = sm * scale, mem * scale
    return Phase(duration_s, sm, mem, w_sm * sm + w_mem * mem)


def demo_processes(count: int, seed: int, span_s: float, first_pid: int = 4100,
                   lead_s: float = IDLE_LEAD_S) -> list[SimProcess]:
    """``count`` processes over ``span_s`` after ``lead_s``: each one alone in turn, then shared.

    All contexts are up and idle first (the static part shows alone); then every process has
    a stretch where it works alone (the other contexts live but idle), so
    an analysis can learn each one's power from the run itself; then they overlap, with
    pauses, and leave one by one. Half are Slurm job steps, half Kubernetes pods.
    """
    rng = np.random.default_rng([seed, 0x41])
    lead, solo = 0.15 * span_s, 0.3 * span_s / count
    shared_end = 0.9 * span_s
    out = []
    for i in range(count):
        kind = WORK_KINDS[i % len(WORK_KINDS)]
        # every context is up well before the first work: a stretch where all are alive and
        # none works, longer than the running list's read interval, shows the static part
        start = lead * 0.3 * i / count
        phases = [Phase(lead + i * solo - start), work_phase(kind, solo, 1.0)]
        if i < count - 1:  # idle (context alive) until every other one had its turn
            phases.append(Phase((count - 1 - i) * solo))
        t = lead + count * solo
        end = shared_end - 0.04 * span_s * (count - 1 - i)
        while t < end - 1e-6:
            d = min(float(rng.uniform(0.3, 1.5)), end - t)
            phases.append(Phase(d) if rng.random() < 0.2
                          else work_phase(kind, d, float(rng.uniform(0.7, 1.1))))
            t += d
        pid = first_pid + 37 * i
        cgroup = (f"/system.slice/slurmstepd.scope/job_7001/step_{i}/user/task_0" if i % 2 == 0
                  else f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                       f"0000{i:04d}_0000_4000_8000_00000000{i:04d}.slice/cri-containerd-"
                       f"{(seed * 1000 + i):064x}.scope")
        out.append(SimProcess(pid, f"sim-{kind[0]}", lead_s + start, tuple(phases),
                              used_memory_b=int((1 + i) * 3 << 30), user=f"user{i % 2}",
                              start_ticks=100_000 + 13 * i, cgroup=cgroup))
    return out


# an H100 80GB's MIG profiles: (GPU-instance slices, SMs); the whole GPU has 132 SMs
MIG_PROFILES = {"1g.10gb": (1, 16), "2g.20gb": (2, 32), "3g.40gb": (3, 60), "4g.40gb": (4, 64),
                "7g.80gb": (7, 132)}
GPU_SMS = 132
MIG_SLICES = 7


@dataclass(frozen=True)
class MigInstance:
    """A GPU instance of a MIG-partitioned GPU: its id and profile (``MIG_PROFILES``)."""

    gi: int
    profile: str

    @property
    def sm_count(self) -> int:
        return MIG_PROFILES[self.profile][1]

    @property
    def slices(self) -> int:
        return MIG_PROFILES[self.profile][0]


def mig_layout(profiles: list[str]) -> list[MigInstance]:
    """Instances of ``profiles`` (GPU instance ids 1, 2, ...); ValueError where they do not fit."""
    unknown = [p for p in profiles if p not in MIG_PROFILES]
    if unknown or not profiles:
        raise ValueError(f"MIG profile {unknown[0]!r} is not one of an H100 80GB's "
                         f"({', '.join(MIG_PROFILES)})" if unknown else "no MIG profile given")
    used = sum(MIG_PROFILES[p][0] for p in profiles)
    if used > MIG_SLICES:
        raise ValueError(f"MIG profiles {','.join(profiles)} take {used} slices of an H100's "
                         f"{MIG_SLICES}")
    return [MigInstance(i + 1, p) for i, p in enumerate(profiles)]


class MigLoad(SharedLoad):
    """Processes in MIG instances: ``instance_of`` pid -> GPU instance id.

    Within an instance processes time-slice its SMs; across instances nothing is shared but
    the card's static power and its power limit (the saturation).
    """

    def __init__(self, processes: list[SimProcess], instances: list[MigInstance],
                 instance_of: dict[int, int], **kwargs: Any) -> None:
        super().__init__(processes, **kwargs)
        self.instances, self.instance_of = instances, instance_of

    def instance_activity(self, a_s: float, b_s: float) -> dict[int, tuple[float, float]]:
        """Each instance's mean (SM %, DRAM bandwidth %) of its own share over [a, b]."""
        k0 = max(0, int(np.searchsorted(self.edges_s, a_s, "right")) - 1)
        k1 = max(0, int(np.searchsorted(self.edges_s, b_s, "right")) - 1)
        touched = slice(k0, min(k1, len(self.edges_s) - 2) + 1)
        lo = np.clip(self.edges_s[:-1][touched], a_s, b_s)
        hi = np.clip(self.edges_s[1:][touched], a_s, b_s)
        w = hi - lo
        span = max(b_s - a_s, 1e-9)
        out = {}
        for inst in self.instances:
            cols = [j for j, p in enumerate(self.processes) if self.instance_of[p.pid] == inst.gi]
            sm = np.minimum(self.sm_pct[touched][:, cols].sum(axis=1), 100.0)
            mem = np.minimum(self.mem_pct[touched][:, cols].sum(axis=1), 100.0)
            out[inst.gi] = (float((sm * w).sum() / span), float((mem * w).sum() / span))
        return out

    def truth(self, gpu: SimulatedGpu, t0_ns: int, t1_ns: int) -> dict[str, Any]:
        """As ``SharedLoad.truth``, with each instance's dynamic energy (``gi{n}``) added."""
        out = super().truth(gpu, t0_ns, t1_ns)
        out["instances_dynamic_j"] = {
            f"gi{inst.gi}": sum(e for pid, e in out["dynamic_j"].items()
                                if self.instance_of[int(pid)] == inst.gi)
            for inst in self.instances}
        return out


def mig_simulated_gpu(profiles: list[str], seed: int, span_s: float = 30.0, index: int = 0,
                      lead_s: float = IDLE_LEAD_S, **kwargs: Any) -> SimulatedGpu:
    """A simulated H100 in MIG mode: one demo process in each instance of ``profiles``.

    A process's utilisation is of its instance's SMs; the power it draws alone scales with
    the instance's share of the GPU's SMs (a 3g.40gb instance busy draws 60/132 of what the
    whole GPU busy with the same work would).
    """
    from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu

    instances = mig_layout(profiles)
    model = GpuModel()
    processes = [replace(p, phases=tuple(replace(ph, power_w=ph.power_w * inst.sm_count / GPU_SMS)
                                         for ph in p.phases))
                 for p, inst in zip(demo_processes(len(instances), seed, span_s,
                                                   4100 + 1000 * index, lead_s),
                                    instances, strict=True)]
    load = MigLoad(processes, instances,
                   {p.pid: inst.gi for p, inst in zip(processes, instances, strict=True)},
                   idle_w=model.idle_w, dynamic_w=model.dynamic_w, seed=seed)
    gpu = SimulatedGpu(index, seed, load.schedule(), model=model, mig=True, **kwargs)
    gpu.processes = load
    gpu.hold_history_from(gpu.start_ns)
    return gpu


def shared_simulated_gpu(count: int, seed: int, span_s: float = 30.0, index: int = 0,
                         lead_s: float = IDLE_LEAD_S, **kwargs: Any) -> SimulatedGpu:
    """A simulated H100 shared by ``count`` demo processes after ``lead_s`` of idle.

    ``processes`` holds them. It keeps its whole waveform (32 kB a second), so the truth
    covers any window.
    """
    from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu

    model = GpuModel()
    processes = demo_processes(count, seed, span_s, 4100 + 1000 * index, lead_s)
    load = SharedLoad(processes, idle_w=model.idle_w, dynamic_w=model.dynamic_w, seed=seed)
    gpu = SimulatedGpu(index, seed, load.schedule(), model=model, **kwargs)
    gpu.processes = load
    gpu.hold_history_from(gpu.start_ns)
    return gpu


def simulated_nvml(gpus: int, seed: int, shared_processes: int = 0,
                   clock_ns: Callable[[], int] = time.monotonic_ns) -> FakeNvml:
    """The fake NVML of ``record --simulate``: ``gpus`` GPUs, each shared by that many processes.

    Without shared processes the GPUs run the demo workload (``simulated_gpus``). With them,
    the GPUs' start (and so their idle lead) is the reader's first timed read, not now
    (``SharedFakeNvml``).
    """
    from wattlab.hardware.fake_nvml import FakeNvml
    from wattlab.hardware.shared_fake_nvml import SharedFakeNvml
    from wattlab.hardware.simulated_gpu import simulated_gpus

    if shared_processes <= 0:
        return FakeNvml(simulated_gpus(gpus, seed))
    return SharedFakeNvml(
        lambda start_ns: [shared_simulated_gpu(shared_processes, seed + i, index=i,
                                               start_ns=start_ns, clock_ns=clock_ns)
                          for i in range(gpus)], clock_ns)
