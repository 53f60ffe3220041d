"""What a framework marker costs the training loop (issue 26: < 1 % of steps >= 10 ms).

    python bench/marker_overhead.py [--markers 2000] [--step-ms 10,50,200] [--blocks 10]

Markers go through the integrations' own path (``PhaseEmitter.step_begin/step_end`` ->
``wattlab.mark``) over a real bus socket to a drain in another process, as in a session.
Paths measured: ``host`` (host time only), ``fake-events`` (the GPU-marker queue and
resolver thread over ``FakeCudaEvents``: what the CUDA path costs apart from the CUDA calls),
and ``cuda`` where PyTorch sees a GPU (events on the current stream, the real resolver).

1. Per marker: wall time on the calling thread and CPU time of the whole process (resolver
   and bus threads included), each minus the same loop without markers.
2. On a training loop: steps of ``--step-ms`` (CPU: that much of the thread's CPU time;
   CUDA: queued matrix products, the host never waiting, timed on the wall clock) with a
   begin/end pair per step against none, in interleaved blocks; the overhead is the median
   difference in time per step as % of the step, and (steadier) two markers' wall cost
   as % of the step.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, write_json
from wattlab.acquisition.markers import gpu_marks
from wattlab.acquisition.markers import program_markers as markers
from wattlab.integrations import PhaseEmitter
from wattlab.sync.bus.publisher import local_endpoint

Step = Callable[[], None]


def drain(endpoint: str, ready: Any) -> None:
    """The recorder's side of the bus: receive and drop every message."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.set()
    while True:
        sock.recv_multipart()


def start_bus() -> multiprocessing.Process:
    endpoint = local_endpoint()
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=drain, args=(endpoint, ready), daemon=True)
    proc.start()
    ready.wait(30)
    os.environ[markers.BUS_ENV] = endpoint
    return proc


def settle() -> None:
    """Wait until the GPU-marker queue is empty (sent), then a little for the bus."""
    resolver = gpu_marks._active
    while resolver is not None and resolver.pending():
        time.sleep(0.001)
    time.sleep(0.05)


def per_marker(n: int, gpu: bool | None) -> dict[str, float]:
    """Wall (calling thread) and process CPU per marker, in µs, net of the bare loop."""
    def loop(emitter: PhaseEmitter) -> tuple[float, float]:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(n // 2):
            emitter.step_begin(i)
            emitter.step_end()
        wall = time.perf_counter() - wall0
        settle()  # the CPU of resolving and sending every marker is in the cost
        return wall, time.process_time() - cpu0

    def emitter(every: int) -> PhaseEmitter:
        return PhaseEmitter(every, lambda name, kind="point", **kw: markers.mark(
            name, kind, gpu=gpu, **kw))

    loop(emitter(1))  # warm-up: sockets, threads, the first pairing
    bare = loop(emitter(0))
    wall, cpu = loop(emitter(1))
    return {"wall_us": 1e6 * (wall - bare[0]) / n, "cpu_us": 1e6 * (cpu - bare[1]) / n}


def timed_blocks(step: Step, sync: Callable[[], None], emitter: PhaseEmitter, steps: int,
                 blocks: int, clock: Callable[[], float]) -> tuple[float, float]:
    """Median seconds per step (with, without markers), in interleaved blocks.

    ``clock``: wall time for GPU steps (the loop waits for the GPU), the thread's CPU time
    for CPU steps (wall time on a shared machine measures the neighbours).
    """
    times: dict[bool, list[float]] = {True: [], False: []}
    for b in range(2 * blocks):
        marked = b % 2 == 0
        sync()
        t0 = clock()
        for i in range(steps):
            if marked:
                emitter.step_begin(i)
            step()
            if marked:
                emitter.step_end()
        sync()
        times[marked].append((clock() - t0) / steps)
    return median(times[True]), median(times[False])


def cpu_step(step_ms: float) -> Step:
    """``step_ms`` of this thread's CPU time: fixed work, whatever else shares the CPU."""
    def step() -> None:
        end = time.thread_time() + step_ms / 1e3
        while time.thread_time() < end:
            pass

    return step


def cuda_step(step_ms: float) -> tuple[Step, Callable[[], None]]:
    """Queued 4096² products adding up to about ``step_ms`` of GPU time; and a sync."""
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 20
    k = max(1, round(step_ms / 1e3 / per))

    def step() -> None:
        for _ in range(k):
            a @ a

    return step, torch.cuda.synchronize


def cuda_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    torch.zeros(1, device="cuda")  # initialise CUDA: GPU markers turn on
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markers", type=int, default=2000)
    parser.add_argument("--step-ms", default="10,50,200")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--blocks", type=int, default=6, help="blocks with and without")
    args = parser.parse_args()
    bus = start_bus()
    paths: list[str] = ["host", "fake-events"] + (["cuda"] if cuda_present() else [])
    rows = []
    try:
        for path in paths:
            if path == "fake-events":
                from wattlab.hardware.fake_cuda_events import FakeCudaEvents

                gpu_marks.install(FakeCudaEvents(min_queue_ns=0), markers._send)
            elif path == "cuda":
                gpu_marks.close()
            gpu = False if path == "host" else None
            cost = per_marker(args.markers, gpu)
            for step_ms in (float(x) for x in args.step_ms.split(",")):
                if path == "cuda":
                    step, sync = cuda_step(step_ms)
                    clock = time.perf_counter
                else:
                    step, sync, clock = cpu_step(step_ms), (lambda: None), time.thread_time
                emitter = PhaseEmitter(1, lambda name, kind="point", _g=gpu, **kw:
                                       markers.mark(name, kind, gpu=_g, **kw))
                with_s, without_s = timed_blocks(step, sync, emitter, args.steps, args.blocks,
                                                 clock)
                rows.append({"path": path, "step_ms": 1e3 * without_s, **cost,
                             "loop_overhead_pct": 100 * (with_s - without_s) / without_s,
                             "marker_share_pct": 100 * 2 * cost["wall_us"] / 1e6 / without_s})
            settle()
    finally:
        gpu_marks.close()
        bus.terminate()
    head = (f"{'path':<12} {'step ms':>8} {'wall µs/marker':>15} {'CPU µs/marker':>14} "
            f"{'2 markers % of step':>20} {'loop overhead %':>16}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['path']:<12} {r['step_ms']:8.1f} {r['wall_us']:15.1f} {r['cpu_us']:14.1f} "
              f"{r['marker_share_pct']:20.3f} {r['loop_overhead_pct']:16.2f}")
    path = write_json("marker_overhead", {"markers": args.markers, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
