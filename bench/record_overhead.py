"""What `wattlab record` costs the workload it watches: step time with and without (issue 39).

    python bench/record_overhead.py --gpu 0 [--pairs 6] [--block-s 6]   # a real GPU (torch)
    python bench/record_overhead.py --simulate [--pairs 2] [--block-s 1]  # numpy, no GPU

One workload process per kind runs steps without pause for the whole benchmark; between
blocks of ``--block-s`` s of steps, a `wattlab record --nvml GPU` (every stream, the
default) is started beside it or not. A pair is one block with the recorder running and one
without, adjacent, their order alternating (ABBA), so a drift of the GPU's clocks or
temperature falls on both sides. The recorder is up and steady (its run file written) before
its block begins (``--settle-s`` after its file appears: NVML's init and the first drains
are a start's cost, not a recording's) and is stopped after it ends; only steps inside a
block are timed.

Kinds: ``matmul`` (20 bf16 products of 8192² a step, ~28 ms on an H200: GPU-bound) and
``small`` (400 element-wise kernels on 4,096 floats a step, a few ms: bound by the host's
launches, where a recorder competing for the CPU would show). With ``--simulate`` the same
shapes run on numpy and the recorder records the simulated GPU: a rehearsal of the
commands, not a measurement.

Per kind: each pair's difference (with − without) / without in %, of the blocks' mean step
time, their mean and the upper bound of its one-sided 95 % confidence interval (Student's t
over the pairs); the same for the blocks' median step, which a few long steps (a stall)
do not move. Issue 39's
goal: that upper bound ≤ 0.5 % with ≥ 6 pairs on the lent GPU. Table on stdout, JSON in
``$WATTLAB_BENCH_RESULTS/record_overhead.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean, median, stdev
from typing import Any

from scipy import stats

from common import doc_parser, write_json

KINDS = ("matmul", "small")
GOAL_UPPER_PCT = 0.5
READY_TIMEOUT_S = 60.0


def worker(kind: str, simulate: bool) -> None:
    """Run steps forever; on each stdin line ``S``, time the steps of the next S seconds and
    print their count and their mean, median and longest step (ms)."""
    if simulate:
        import numpy as np

        a = np.ones((256, 256))
        small = np.ones(4096)

        def step() -> None:
            if kind == "matmul":
                for _ in range(4):
                    a @ a
            else:
                for _ in range(400):
                    small.__iadd__(1.0)
    else:
        import torch

        m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        v = torch.zeros(4096, device="cuda")

        def step() -> None:
            if kind == "matmul":
                for _ in range(20):
                    m @ m
            else:
                for _ in range(400):
                    v.add_(1.0)
            torch.cuda.synchronize()

    for _ in range(20):  # warm: clocks up, kernels loaded
        step()
    print("ready", flush=True)
    for line in sys.stdin:
        seconds = float(line)
        steps_ms: list[float] = []
        t0 = last = time.perf_counter()
        while last - t0 < seconds:
            step()
            now = time.perf_counter()
            steps_ms.append((now - last) * 1e3)
            last = now
        print(f"{len(steps_ms)} {(last - t0) / len(steps_ms) * 1e3:.6f} "
              f"{median(steps_ms):.6f} {max(steps_ms):.6f}", flush=True)


def recorder(args: argparse.Namespace, out: Path) -> subprocess.Popen[bytes]:
    """`wattlab record` of the GPU (or the simulated one), up and writing when returned."""
    source = ["--simulate"] if args.simulate else ["--nvml", str(args.gpu)]
    proc = subprocess.Popen([sys.executable, "-m", "wattlab.cli", "record", *source,
                             *args.record_args.split(), "--no-live", "--duration", "3600",
                             "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (out.exists() and out.stat().st_size > 0):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"record_overhead: the recorder did not start: "
                             f"{(proc.stderr.read() if proc.stderr else b'').decode()[-400:]}")
        time.sleep(0.1)
    time.sleep(args.settle_s)  # past its start (NVML's init, the first drains): steady
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def block(load: subprocess.Popen[str], seconds: float) -> tuple[float, float, float]:
    """Mean, median and longest step (ms) of the workload's next ``seconds`` of steps."""
    assert load.stdin is not None and load.stdout is not None
    load.stdin.write(f"{seconds}\n")
    load.stdin.flush()
    _, mean_ms, median_ms, max_ms = load.stdout.readline().split()
    return float(mean_ms), float(median_ms), float(max_ms)


def measure(args: argparse.Namespace, kind: str, folder: Path) -> dict[str, Any]:
    """Alternated pairs of blocks for one kind of workload."""
    cmd = [sys.executable, __file__, "--worker", kind] + (["--simulate"] if args.simulate
                                                           else [])
    load = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pairs: list[dict[str, float]] = []
    try:
        assert load.stdout is not None
        if load.stdout.readline().strip() != "ready":
            raise SystemExit(f"record_overhead: the {kind} workload did not start")
        for k in range(args.pairs):
            pair: dict[str, float] = {}
            for with_recorder in ((True, False) if k % 2 == 0 else (False, True)):
                side = "with" if with_recorder else "without"
                proc = recorder(args, folder / f"{kind}-{k}.h5") if with_recorder else None
                try:
                    (pair[f"{side}_ms"], pair[f"{side}_median_ms"],
                     pair[f"{side}_max_ms"]) = block(load, args.block_s)
                finally:
                    if proc is not None:
                        stop(proc)
            pair["difference_pct"] = 100.0 * (pair["with_ms"] / pair["without_ms"] - 1.0)
            pair["median_difference_pct"] = 100.0 * (pair["with_median_ms"]
                                                     / pair["without_median_ms"] - 1.0)
            pairs.append(pair)
            print(f"  {kind} pair {k + 1}: mean with {pair['with_ms']:.4f} / without "
                  f"{pair['without_ms']:.4f} ms ({pair['difference_pct']:+.3f} %), median "
                  f"{pair['median_difference_pct']:+.3f} %, longest step "
                  f"{pair['with_max_ms']:.2f} / {pair['without_max_ms']:.2f} ms", flush=True)
    finally:
        load.kill()
        load.wait()
    return summary(kind, pairs)


def upper95(d: list[float]) -> tuple[float, float]:
    """The mean of paired differences and its one-sided 95 % upper bound (Student's t)."""
    m = mean(d)
    if len(d) < 2:
        return m, math.nan
    return m, m + float(stats.t.ppf(0.95, len(d) - 1)) * stdev(d) / math.sqrt(len(d))


def summary(kind: str, pairs: list[dict[str, float]]) -> dict[str, Any]:
    """Per kind: the blocks' mean step time's paired difference (the goal's figure) and the
    median step's (robust to a few long steps: whether a cost is steady or a stall)."""
    m, upper = upper95([p["difference_pct"] for p in pairs])
    m_med, upper_med = upper95([p["median_difference_pct"] for p in pairs])
    return {"kind": kind, "pairs": pairs, "mean_difference_pct": m,
            "upper95_difference_pct": upper, "median_step_difference_pct": m_med,
            "median_step_upper95_pct": upper_med,
            "met": bool(len(pairs) >= 6 and upper <= GOAL_UPPER_PCT)}


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--simulate", action="store_true", help="numpy and the simulated GPU")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--block-s", type=float, default=6.0)
    parser.add_argument("--settle-s", type=float, default=5.0,
                        help="after the recorder's file appears, before its block")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--record-args", default="",
                        help="more `record` options, e.g. the frugal reader's")
    parser.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
            worker(args.worker, args.simulate)
        return 0
    kinds = args.kinds.split(",")
    if (args.pairs < 2 or not 0 < args.block_s < math.inf or not 0 <= args.settle_s < math.inf
            or not set(kinds) <= set(KINDS)):
        parser.error(f"--pairs must be >= 2, --block-s > 0 and --settle-s >= 0 (finite), "
                     f"--kinds from {','.join(KINDS)}")
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(args, kind, Path(tmp)) for kind in kinds]
    print(f"step time under `wattlab record` ({'simulated' if args.simulate else 'GPU'}), "
          f"{args.pairs} alternated pairs of {args.block_s:g} s blocks")
    print(f"{'kind':8s} {'mean difference':>16s} {'upper 95 %':>11s} {'median step':>12s} "
          f"{'upper 95 %':>11s}  goal: mean's upper <= {GOAL_UPPER_PCT} % with >= 6 pairs")
    for r in results:
        print(f"{r['kind']:8s} {r['mean_difference_pct']:+15.3f}% "
              f"{r['upper95_difference_pct']:+10.3f}% {r['median_step_difference_pct']:+11.3f}% "
              f"{r['median_step_upper95_pct']:+10.3f}%  {'met' if r['met'] else 'NOT met'}")
    path = write_json("record_overhead", {"simulate": args.simulate, "gpu": args.gpu,
                                          "record_args": args.record_args,
                                          "block_s": args.block_s, "kinds": results})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
