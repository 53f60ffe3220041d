"""Processes sharing one real GPU: the truth the per-process attribution is checked against.

Each workload does a fixed amount of work (``work NAME``), marked ``work`` with the GPU
synchronised at both edges and its pid in the payload. ``pairs`` runs, under
``wattlab record``, each workload of a pair alone and then both at once; a thread samples
``nvmlDeviceGetProcessUtilization`` (no privileges needed) every 100 ms and marks each
process's sample as ``proc_util`` (pid, SM %, memory %, the driver's unix µs), so the run
file holds the power streams, which process worked when, and what the driver said of each.
Truth for the shared run: each process's exclusive dynamic energy (its alone run above
idle) as a share of the pair's. Read-only on the card: it only runs kernels and reads.

    wattlab record --nvml 0 -o pairs.h5 -- python shared_gpu.py pairs
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch

import wattlab

PAIRS = [("matmul", "copy"), ("matmul", "smallk"), ("copy", "smallk"), ("matmul", "train")]


def repeat(iters: int, step: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        for _ in range(iters):
            step()
    return run


def matmul(iters: int) -> Callable[[], None]:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    return repeat(iters, lambda: torch.matmul(a, b, out=out))


def copy(iters: int) -> Callable[[], None]:
    src = torch.randn(512 * 1024 * 1024 // 4, device="cuda")  # 512 MiB
    dst = torch.empty_like(src)
    return repeat(iters, lambda: dst.copy_(src))


def smallk(iters: int) -> Callable[[], None]:
    x = torch.randn(4096, device="cuda")
    return repeat(iters, lambda: x.mul_(1.0000001))


def train(iters: int) -> Callable[[], None]:
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(4096, 2048, device="cuda")
    y = torch.randint(0, 10, (4096,), device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return repeat(iters, step)


# iterations for a few seconds alone on an H200 (estimated from its peak rates; each run
# prints its time): the amount of work is what is fixed, alone and shared alike
WORK = {"matmul": (matmul, 2600), "copy": (copy, 12_000), "smallk": (smallk, 400_000),
        "train": (train, 1200)}


def work(name: str) -> None:
    make, iters = WORK[name]
    run = make(iters)
    make(3)()  # warm-up: kernels chosen, memory allocated, before the marked work
    torch.cuda.synchronize()
    with wattlab.phase("work", workload=name, pid=os.getpid()):
        start = time.monotonic()
        run()
        torch.cuda.synchronize()
    print(f"{name}: {time.monotonic() - start:.2f} s", flush=True)


def sample_processes(stop: threading.Event) -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    last_us = 0
    while not stop.wait(0.1):
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, last_us)
        except pynvml.NVMLError:  # NOT_FOUND: no process sampled since last_us
            continue
        for s in samples:
            last_us = max(last_us, int(s.timeStamp))
            wattlab.mark("proc_util", pid=int(s.pid), sm=int(s.smUtil), mem=int(s.memUtil),
                         t_unix_us=int(s.timeStamp))


def together(names: list[str]) -> None:
    procs = [subprocess.Popen([sys.executable, __file__, "work", n]) for n in names]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"workload exited {p.returncode}")


def pairs(idle_s: float) -> None:
    stop = threading.Event()
    sampler = threading.Thread(target=sample_processes, args=(stop,), daemon=True)
    sampler.start()
    with wattlab.phase("idle"):
        time.sleep(idle_s)
    for a, b in PAIRS:
        for names in ([a], [b], [a, b]):
            with wattlab.phase("run", workloads="+".join(names)):
                together(names)
            time.sleep(1.0)
    with wattlab.phase("idle"):
        time.sleep(idle_s)
    stop.set()
    sampler.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("work").add_argument("name", choices=sorted(WORK))
    sub.add_parser("pairs").add_argument("--idle-s", type=float, default=3.0)
    args = parser.parse_args()
    if args.verb == "work":
        work(args.name)
    else:
        pairs(args.idle_s)


if __name__ == "__main__":
    main()
