"""Per-layer work on a real GPU: each layer's real inputs, replayed alone, timed by CUDA events.

Why: a layer's energy cannot be read from one step (module doc of measure.py), so every
leaf module's inputs are captured during one real forward pass and the module is re-run on
them alone. Forward: the module under ``no_grad`` (training mode kept when measuring a
training step, so batch norm does what it does there). Backward: the module's graph is
built once and ``torch.autograd.grad`` replays its backward with a random output gradient
(``retain_graph``), for the inputs that needed a gradient in the model and the module's
own parameters. In-place modules run out of place on a copy (their inputs are reused).

The energy counter is NVML's (``nvmlDeviceGetTotalEnergyConsumption``), polled by a thread
while the GPU is busy; only reads happen: no setting of the GPU is changed.
"""

from __future__ import annotations

import copy
import itertools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from wattlab.acquisition.gpu_clock import EventBackend
from wattlab.layers.counting import LayerRow, _tensors, leaf_modules
from wattlab.layers.measure import Window

Job = Callable[[], Any]


class TorchBackend:
    """`Backend` on a torch device: GPU time from events, energy from an NVML driver's counter.

    ``events``: CUDA's (``TorchCudaEvents``), or the fake GPU's where a test runs on a CPU.
    """

    def __init__(self, read_energy_j: Callable[[], float], events: EventBackend) -> None:
        self.read_energy_j = read_energy_j
        self.events = events

    def _elapsed_s(self, start: Any, end: Any) -> float:
        return self.events.elapsed_ns(start, end) / 1e9

    def time_s(self, job: Job, repeats: int) -> float:
        start = self.events.record()
        for _ in range(repeats):
            job()
        end = self.events.record()
        self.events.wait(end)
        return self._elapsed_s(start, end)

    def window(self, job: Job, repeats: int, chunks: int) -> Window:
        ticks: list[tuple[float, float]] = []
        polls: list[float] = []
        stop = threading.Event()

        def poll() -> None:
            last = None
            while not stop.is_set():
                value = self.read_energy_j()
                now = time.monotonic()
                polls.append(now)
                if value != last:
                    ticks.append((now, value))
                    last = value
                time.sleep(0.0005)

        self.events.wait(self.events.record())
        watcher = threading.Thread(target=poll, name="wattlab-layer-counter", daemon=True)
        watcher.start()
        time.sleep(0.15)  # the watcher's first value is a baseline, not a tick
        start_s = time.monotonic()
        events = [self.events.record()]
        per_chunk = repeats // chunks
        for _ in range(chunks):
            for _ in range(per_chunk):
                job()
            events.append(self.events.record())
        self.events.wait(events[-1])
        end_s = time.monotonic()
        stop.set()
        watcher.join()
        chunk_s = np.array([self._elapsed_s(a, b) for a, b in itertools.pairwise(events)])
        gaps = np.diff(polls) if len(polls) > 1 else np.array([0.003])
        jitter = float(statistics.median(gaps.tolist())) / 12**0.5
        t = np.array([x for x, _ in ticks[1:]])
        e = np.array([y for _, y in ticks[1:]])
        return Window(chunk_s, per_chunk * chunks, start_s, end_s, t, e, jitter)


def capture_inputs(model: Any, x: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every leaf module's tensor inputs, per call, from one forward pass (copies)."""
    import torch
    seen: dict[str, list[tuple[Any, ...]]] = {}
    handles = []
    for name, module in leaf_modules(model):
        def pre(_m: Any, args: Any, name: str = name) -> None:
            seen.setdefault(name, []).append(
                tuple(a.detach().clone().requires_grad_(a.requires_grad)
                      if isinstance(a, torch.Tensor) else a for a in args))
        handles.append(module.register_forward_pre_hook(pre))
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def _out_of_place(module: Any) -> Any:
    copied = copy.deepcopy(module)
    for m in copied.modules():
        if getattr(m, "inplace", False):
            m.inplace = False
    return copied


def layer_job(model: Any, row: LayerRow, inputs: dict[str, list[tuple[Any, ...]]]) -> Job:
    """Run one row's module alone on its captured inputs (every call of one pass)."""
    import torch
    module = _out_of_place(dict(leaf_modules(model))[row.name])
    calls = inputs[row.name]
    if row.pass_name == "forward":
        def forward() -> None:
            with torch.no_grad():
                for args in calls:
                    module(*args)
        return forward
    replays = []
    params = [p for p in module.parameters() if p.requires_grad]
    for args in calls:
        xs = tuple(a.detach().requires_grad_(a.requires_grad)
                   if isinstance(a, torch.Tensor) else a for a in args)
        outs = [t for t in _tensors(module(*xs)) if t.requires_grad]
        wrt = [a for a in xs if isinstance(a, torch.Tensor) and a.requires_grad] + params
        if outs and wrt:
            replays.append((outs, wrt, [torch.randn_like(t) for t in outs]))

    def backward() -> None:
        for outs, wrt, grads in replays:
            torch.autograd.grad(outs, wrt, grads, retain_graph=True)
    return backward


def group_job(jobs: list[Job]) -> Job:
    def run_all() -> None:
        for job in jobs:
            job()
    return run_all


def step_job(model: Any, x: Any, train: bool) -> Job:
    """The whole pass as the model runs it: forward, or forward + backward of a sum loss."""
    import torch

    def forward() -> None:
        with torch.no_grad():
            model(x)

    def train_step() -> None:
        outs = [t for t in _tensors(model(x)) if t.requires_grad]
        sum(t.float().sum() for t in outs).backward()
        for p in model.parameters():
            p.grad = None
    return train_step if train else forward
