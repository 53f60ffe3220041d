"""Host cost of per-layer markers (`--auto-markers=layers`) per layer boundary, on a CPU.

A stack of 48 small leaf modules (Linear 64->64 and ReLU, batch 8) trains for 200 steps
per variant: no hooks; the boundary hooks with a callback that does nothing; the layer
markers on every step (each boundary: a fake CUDA event recorded, the marker queued to
the resolver thread, resolved and handed to a counting sender); and the markers on every
100th step (the others' hooks return at once). The extra host time per step, divided by
the boundaries of a step (forward and backward begin and end of every layer), is the cost
per boundary; the median of 5 repeats.

PYTHONPATH=src python bench/layer_markers.py   (about a minute; writes
results/layer_markers.json)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_json

STEPS, REPEATS, LAYERS = 200, 5, 24


def model() -> Any:
    import torch.nn as nn

    return nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(64, 64), nn.ReLU())])


def step_s(net: Any, opt: Any, x: Any) -> float:
    t0 = time.perf_counter()
    for _ in range(STEPS):
        net(x).sum().backward()
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - t0) / STEPS


def timed(setup: Callable[[Any], Callable[[], None]]) -> float:
    import torch

    runs = []
    for _ in range(REPEATS):
        net = model()
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        x = torch.randn(8, 64)
        undo = setup(net)
        step_s(net, opt, x)  # warm-up
        runs.append(step_s(net, opt, x))
        undo()
    return statistics.median(runs)


def main() -> None:
    import torch

    from wattlab.acquisition.markers import gpu_marks
    from wattlab.acquisition.markers import program_markers as markers
    from wattlab.hardware.fake_cuda_events import FakeCudaEvents
    from wattlab.integrations.layer_hooks import hook_leaves
    from wattlab.integrations.layer_marks import mark_layers

    torch.set_num_threads(1)
    sent = [0]
    os.environ[markers.BUS_ENV] = "inproc://bench-layer-markers"  # stamps take GPU events
    resolver = gpu_marks.install(FakeCudaEvents(min_queue_ns=0),
                                 lambda _m: sent.__setitem__(0, sent[0] + 1))

    def hooks_only(net: Any) -> Callable[[], None]:
        return hook_leaves(net, lambda *_a: None).remove

    def marks(every: int) -> Callable[[Any], Callable[[], None]]:
        def setup(net: Any) -> Callable[[], None]:
            return mark_layers(net, every_n_steps=every).remove
        return setup

    boundaries = 4 * 2 * LAYERS
    base = timed(lambda _n: lambda: None)
    rows = []
    for name, setup in (("hooks, no-op callback", hooks_only), ("markers, every step", marks(1)),
                        ("markers, every 100th step", marks(100))):
        t = timed(setup)
        rows.append({"variant": name, "step_ms": t * 1e3,
                     "per_boundary_us": (t - base) / boundaries * 1e6})
    while resolver.pending():
        time.sleep(0.01)
    print(f"{2 * LAYERS} leaf modules, {boundaries} boundaries a step; no hooks: "
          f"{base * 1e3:.3f} ms a step (CPU, 1 thread)")
    print(f"{'variant':28} {'ms a step':>10} {'µs a boundary':>14}")
    for r in rows:
        print(f"{r['variant']:28} {r['step_ms']:10.3f} {r['per_boundary_us']:14.1f}")
    print(f"markers sent: {sent[0]}")
    print("written:", write_json("layer_markers", {"base_step_ms": base * 1e3,
                                                    "boundaries": boundaries, "rows": rows,
                                                    "sent": sent[0]}))
    resolver.close()


if __name__ == "__main__":
    main()
