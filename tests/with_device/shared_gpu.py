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
    wattlab record --nvml 0 -o pairs.h5 -- python shared_gpu.py pairs --stagger 0.5 --scale 3

``--stagger F``: in each together run both processes start, warm up and wait; the one whose
work took less time alone is released first and works alone for F of that time before the
other is released (both contexts live, so the reader has rows of the lone work). The rule
then has a stretch of the shared run itself to learn the first one's power from, which the
simultaneous start gives a small workload only by chance. ``--scale K`` multiplies every
workload's work (alone and together alike), so a lone stretch holds more of the reader's
0.9 s reads.
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
from wattlab.arg_types import Number, seconds

STAGGER = Number(0.0, 10.0)  # F of the shorter's alone time (0: the other released at once)
SCALE = Number(0.0, 1000.0, above=True)  # times each workload's fixed work
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


def work(name: str, gated: bool = False, scale: float = 1.0) -> None:
    make, iters = WORK[name]
    run = make(round(iters * scale))
    make(3)()  # warm-up: kernels chosen, memory allocated, before the marked work
    torch.cuda.synchronize()
    if gated:  # tell the parent, then wait for its go (the context stays live meanwhile)
        print("ready", flush=True)
        sys.stdin.readline()
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


def worker(name: str, scale: float, *extra: str) -> list[str]:
    return [sys.executable, __file__, "work", name, "--scale", str(scale), *extra]


def together(names: list[str], scale: float) -> None:
    procs = [subprocess.Popen(worker(n, scale)) for n in names]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"workload exited {p.returncode}")


def staggered(names: list[str], alone_s: dict[str, float], fraction: float,
              scale: float) -> None:
    """Both warmed up and waiting; the shorter released first, the other ``fraction`` of
    its alone time later."""
    order = sorted(names, key=lambda n: alone_s[n])
    procs = [subprocess.Popen(worker(n, scale, "--gated"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
             for n in order]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.args
    for k, p in enumerate(procs):
        if k:
            time.sleep(fraction * alone_s[order[0]])
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.close()
    for p in procs:
        assert p.stdout is not None
        print(p.stdout.read(), end="", flush=True)
        if p.wait() != 0:
            raise SystemExit(f"workload exited {p.returncode}")


def timed_alone(name: str, scale: float) -> float:
    """One workload alone; its marked work's seconds, as it printed them."""
    done = subprocess.run(worker(name, scale), check=True,
                          capture_output=True, text=True)
    print(done.stdout, end="", flush=True)
    return float(done.stdout.strip().splitlines()[-1].split(":")[1].split()[0])


def pairs(idle_s: float, stagger: float | None = None, scale: float = 1.0) -> None:
    stop = threading.Event()
    sampler = threading.Thread(target=sample_processes, args=(stop,), daemon=True)
    sampler.start()
    with wattlab.phase("idle"):
        time.sleep(idle_s)
    for a, b in PAIRS:
        alone_s: dict[str, float] = {}
        for names in ([a], [b], [a, b]):
            with wattlab.phase("run", workloads="+".join(names)):
                if stagger is None:
                    together(names, scale)
                elif len(names) == 1:
                    alone_s[names[0]] = timed_alone(names[0], scale)
                else:
                    staggered(names, alone_s, stagger, scale)
            time.sleep(1.0)
    with wattlab.phase("idle"):
        time.sleep(idle_s)
    stop.set()
    sampler.join()


def parser() -> argparse.ArgumentParser:
    """The verbs and their options.

    Why typed: a nan, inf or negative ``--stagger`` or ``--scale`` ended in a traceback
    (``time.sleep``, ``round``) minutes into a recording, or ran no work; argparse refuses
    it at once (exit 2), naming the option and its range.
    """
    top = argparse.ArgumentParser(description=__doc__)
    sub = top.add_subparsers(dest="verb", required=True)
    one = sub.add_parser("work")
    one.add_argument("name", choices=sorted(WORK))
    one.add_argument("--gated", action="store_true", help="wait for 'go' on stdin after warm-up")
    one.add_argument("--scale", type=SCALE, default=1.0, help="times the fixed work")
    both = sub.add_parser("pairs")
    both.add_argument("--idle-s", type=seconds(zero=True), default=3.0)
    both.add_argument("--stagger", type=STAGGER, default=None, metavar="F",
                      help="release the shorter first, the other F of its alone time later")
    both.add_argument("--scale", type=SCALE, default=1.0, help="times each workload's work")
    return top


def main() -> None:
    args = parser().parse_args()
    if args.verb == "work":
        work(args.name, args.gated, args.scale)
    else:
        pairs(args.idle_s, args.stagger, args.scale)


if __name__ == "__main__":
    main()
