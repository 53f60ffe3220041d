"""Each layer's GPU time inside real steps, from the kernels of a PyTorch profiler trace.

Why kernels and not events at the layer boundaries: an event per boundary costs the host
tens of µs, so a step of many small layers (ResNet50 at batch 32) waits on the host and
the spans measure the host's pace. A kernel's duration, as CUPTI records it, does not
depend on how fast the host launched it. So a profiled run with a ``wl:LABEL:PASS`` range
around every leaf module (`capture.py`) gives every kernel's layer: the innermost ``wl:``
range open on the launching thread when the kernel was launched (forward ranges on the
main thread, backward ones on autograd's thread, where the launches happen). Kernels
launched outside every range (residual additions, the loss, optimiser glue) go to the row
``between layers``.

The trace is Kineto's Chrome trace (``prof.export_chrome_trace``, gzip or plain JSON):
GPU activities (``kernel``, ``gpu_memset``, ``gpu_memcpy``) name their launch by
``args.correlation``, which a ``cuda_runtime`` or ``cuda_driver`` event on the host
carries too. Times are µs; an event's unix time is ``baseTimeNanoseconds`` / 1e9 + ts / 1e6.

Steps: a ``wl:step`` range per step when the capture emits one, else each begin of the
first leaf's forward range. A step's kernels are those launched within it.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wattlab.errors import UsageError
from wattlab.layers.in_step import BETWEEN

GPU_CATS = ("kernel", "gpu_memset", "gpu_memcpy")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
PREFIX = "wl:"
STEP_RANGE = "wl:step"
IDLE = "GPU idle (host-bound)"


class TraceError(UsageError):
    """A profiler trace that cannot give per-layer kernel times (bad input: exit 2)."""


@dataclass(frozen=True)
class Activity:
    """One GPU activity: its name, row key (None before attribution), GPU start and length µs."""

    name: str
    key: str | None
    start_us: float
    dur_us: float
    launch_us: float


@dataclass
class Trace:
    """The GPU activities in launch order, the ``wl:`` ranges and the step starts (µs)."""

    path: str
    activities: list[Activity]
    step_starts_us: list[float]
    base_unix_s: float


@dataclass
class LayerTimes:
    """Mean GPU busy time per step of every row key, ± standard errors over the steps.

    ``period_s``: from one step's first GPU activity to the next step's (`periods_us`);
    ``idle_s`` = period − busy: the GPU waiting for the host.
    """

    time_s: dict[str, float]
    time_se_s: dict[str, float]
    busy_s: float
    busy_se_s: float
    period_s: float
    idle_s: float
    idle_se_s: float
    steps: int


def load_json(path: str | Path) -> dict[str, Any]:
    """The trace's JSON, gzip or plain (told apart by the gzip magic bytes)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, EOFError, ValueError) as e:
        raise TraceError(f"{path}: not a readable profiler trace ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: no traceEvents list: not a PyTorch profiler trace")
    return data


def _innermost(launches: list[tuple[float, int]], ranges: list[tuple[float, float, str]],
               keys: list[str | None]) -> None:
    """Set ``keys[i]`` to the innermost range open at each launch (one thread's, both sorted).

    The ranges of one thread nest (a leaf's hooks open and close them in order), so a stack
    of the open ones has the innermost on top.
    """
    stack: list[tuple[float, str]] = []
    r = 0
    for t, i in launches:
        while r < len(ranges) and ranges[r][0] <= t:
            start, end, name = ranges[r]
            while stack and stack[-1][0] <= start:
                stack.pop()
            stack.append((end, name))
            r += 1
        while stack and stack[-1][0] < t:
            stack.pop()
        keys[i] = stack[-1][1] if stack else None


def read_trace(path: str | Path, *, ranges: bool = True) -> Trace:
    """The trace's GPU activities attributed to rows, and its steps.

    ``ranges=False``: a plain profiled run (no ``wl:`` ranges): every key is None and there
    are no step starts (`match_steps` finds the steps by the kernels' sequence).
    """
    data = load_json(path)
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]
    launch_of: dict[Any, tuple[Any, float]] = {}
    layer_ranges: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    step_starts: list[float] = []
    gpu: list[dict[str, Any]] = []
    for e in events:
        cat = e.get("cat")
        if cat in GPU_CATS:
            gpu.append(e)
        elif cat in LAUNCH_CATS and "correlation" in e.get("args", {}):
            launch_of[e["args"]["correlation"]] = (e.get("tid"), float(e["ts"]))
        elif cat == "user_annotation" and str(e.get("name", "")).startswith(PREFIX):
            start = float(e["ts"])
            if e["name"] == STEP_RANGE:
                step_starts.append(start)
            else:
                layer_ranges[e.get("tid")].append(
                    (start, start + float(e.get("dur", 0.0)), e["name"][len(PREFIX):]))
    if not gpu:
        raise TraceError(f"{path}: no GPU kernels in the trace (profile with "
                         "ProfilerActivity.CUDA)")
    if ranges and not layer_ranges:
        raise TraceError(f"{path}: no '{PREFIX}' ranges: profile with the layer ranges on "
                         "(wattlab.layers.capture)")
    gpu.sort(key=lambda e: float(e["ts"]))
    launch = [launch_of.get(e.get("args", {}).get("correlation")) for e in gpu]
    keys: list[str | None] = [None] * len(gpu)
    per_thread: dict[Any, list[tuple[float, int]]] = defaultdict(list)
    for i, found in enumerate(launch):
        if found is not None:
            per_thread[found[0]].append((found[1], i))
    for tid, launches in per_thread.items():
        _innermost(sorted(launches), sorted(layer_ranges.get(tid, [])), keys)
    acts = [Activity(str(e.get("name", "")), keys[i], float(e["ts"]), float(e.get("dur", 0.0)),
                     found[1] if found is not None else float(e["ts"]))
            for i, (e, found) in enumerate(zip(gpu, launch, strict=True))]
    if ranges and not step_starts:
        step_starts = _first_leaf_begins(layer_ranges)
    return Trace(str(path), acts, sorted(step_starts),
                 float(data.get("baseTimeNanoseconds", 0)) / 1e9)


def _first_leaf_begins(layer_ranges: dict[Any, list[tuple[float, float, str]]]) -> list[float]:
    """Each begin of the first leaf's forward range: the steps, where no ``wl:step`` was set."""
    forward = sorted(r for rs in layer_ranges.values() for r in rs
                     if r[2].endswith(":forward"))
    if not forward:
        return []
    first = forward[0][2]
    return [start for start, _, name in forward if name == first]


def split_steps(trace: Trace) -> list[list[Activity]]:
    """The activities of each step (launched from its start to the next's), keys filled.

    A key None (launched outside every range) becomes ``between layers``; activities
    launched before the first step are left out.
    """
    if not trace.step_starts_us:
        raise TraceError(f"{trace.path}: no steps found (no '{STEP_RANGE}' range and no "
                         "forward range)")
    edges = np.array(trace.step_starts_us)
    steps: list[list[Activity]] = [[] for _ in edges]
    for a in trace.activities:
        k = int(np.searchsorted(edges, a.launch_us, side="right")) - 1
        if k >= 0:
            steps[k].append(Activity(a.name, a.key or BETWEEN, a.start_us, a.dur_us,
                                     a.launch_us))
    return [sorted(s, key=lambda a: a.start_us) for s in steps if s]


def periods_us(steps: Sequence[Sequence[Activity]]) -> list[float]:
    """Each step's GPU period: its first activity to the next step's first.

    The last step has no next one: it counts only when it is the only step (to its last
    activity's end), since without the gap before the next step its idle time is short.
    """
    firsts = [s[0].start_us for s in steps]
    if len(steps) == 1:
        return [steps[0][-1].start_us + steps[0][-1].dur_us - firsts[0]]
    return [b - a for a, b in itertools.pairwise(firsts)]


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    v = np.asarray(values, float)
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else 0.0
    return float(v.mean()), se


def layer_times(steps: Sequence[Sequence[Activity]]) -> LayerTimes:
    """Mean GPU busy time per step of every key (± se over the steps), and the idle time."""
    if not steps:
        raise TraceError("no complete step among the trace's kernels")
    per_step: list[dict[str, float]] = []
    for s in steps:
        by_key: dict[str, float] = defaultdict(float)
        for a in s:
            by_key[a.key or BETWEEN] += a.dur_us / 1e6
        per_step.append(by_key)
    keys = sorted({k for s in per_step for k in s})
    stats = {k: _mean_se([s.get(k, 0.0) for s in per_step]) for k in keys}
    busy_s = [sum(s.values()) for s in per_step]
    periods_s = [p / 1e6 for p in periods_us(steps)]
    busy, busy_se = _mean_se(busy_s)
    idle, idle_se = _mean_se([p - b for p, b in zip(periods_s, busy_s, strict=False)])
    return LayerTimes({k: v[0] for k, v in stats.items()}, {k: v[1] for k, v in stats.items()},
                      busy, busy_se, float(np.mean(periods_s)), idle, idle_se, len(steps))


def template(steps: Sequence[Sequence[Activity]]) -> list[Activity]:
    """The step whose kernel-name sequence is the most common: the others' reference."""
    names = Counter(tuple(a.name for a in s) for s in steps)
    common = names.most_common(1)[0][0]
    return list(next(s for s in steps if tuple(a.name for a in s) == common))


def match_steps(plain: Trace, reference: Sequence[Activity]) -> list[list[Activity]]:
    """The plain run's steps: runs of its kernels with the reference step's names in order.

    Each matched activity takes the key of the reference's activity at the same place. An
    empty list: no step of the plain run launched the same kernels as the hooked one.
    """
    names = [a.name for a in plain.activities]
    want = [a.name for a in reference]
    n = len(want)
    steps: list[list[Activity]] = []
    i = 0
    while i + n <= len(names):
        if names[i] == want[0] and names[i:i + n] == want:
            steps.append([Activity(a.name, r.key, a.start_us, a.dur_us, a.launch_us)
                          for a, r in zip(plain.activities[i:i + n], reference, strict=True)])
            i += n
        else:
            i += 1
    return steps


@dataclass
class Layout:
    """Where each row runs in the step: segments [start, end) as fractions of the step."""

    keys: list[str]
    start: np.ndarray
    end: np.ndarray
    period_s: float
    source: str


def _segments(keys: Sequence[str], starts: np.ndarray, ends: np.ndarray, period: float,
              source: str) -> Layout:
    """Segments from activities (µs from the step's start) with the gaps as ``IDLE``.

    Consecutive pieces of one key merge; the last piece reaches the step's end.
    """
    out_k: list[str] = []
    out_s: list[float] = []
    out_e: list[float] = []

    def add(key: str, a: float, b: float) -> None:
        if b <= a:
            return
        if out_k and out_k[-1] == key and abs(out_e[-1] - a) < 1e-9:
            out_e[-1] = b
        else:
            out_k.append(key)
            out_s.append(a)
            out_e.append(b)

    t = 0.0
    for key, a0, b in zip(keys, starts, ends, strict=True):
        a = max(float(a0), t)
        add(IDLE, t, a)
        add(key, a, max(float(b), a))
        t = max(t, float(b))
    add(IDLE, t, period)
    s, e = np.array(out_s) / out_e[-1], np.array(out_e) / out_e[-1]
    return Layout(out_k, s, e, period / 1e6, source)


def mean_layout(steps: Sequence[Sequence[Activity]]) -> Layout:
    """The steps' mean layout, gaps included (steps with the same kernels in the same order)."""
    n = len(steps[0])
    starts = np.array([[a.start_us - s[0].start_us for a in s] for s in steps if len(s) == n])
    ends = starts + np.array([[a.dur_us for a in s] for s in steps if len(s) == n])
    period = float(np.mean(periods_us(steps)))
    return _segments([a.key or BETWEEN for a in steps[0]], starts.mean(0), ends.mean(0),
                     period, "plain profiled run")


def busy_layout(reference: Sequence[Activity]) -> Layout:
    """A layout with no gaps: the reference step's activities back to back (no plain run)."""
    dur = np.array([a.dur_us for a in reference])
    ends = np.cumsum(dur)
    return _segments([a.key or BETWEEN for a in reference], ends - dur, ends,
                     float(ends[-1]), "hooked run's kernels back to back (no idle)")
