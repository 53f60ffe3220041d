"""On the lent GPU: what each per-process NVML call costs, and how far back the driver keeps
per-process utilisation samples (how rarely the stream may read without losing one).

    python bench/device_process_calls.py [--gpu 0] [--loads 2] [--calls 40] [--no-pauses]

Issue 41 asks the per-process stream to add <= 0.05 % of a core; one read (utilisation +
running processes) measured 2,756 us of CPU on the lent H200. This starts ``--loads`` CUDA
processes (bf16 matrix loops, torch), then, per call, the CPU time (this process's
``time.process_time``: the driver's ioctls count there) of ``--calls`` calls back to back,
and after pauses of 1 to 40 s one utilisation read since the last: how many samples came
back, their spacing, and whether the oldest follows the previous read's newest by one
spacing (nothing lost; ``--no-pauses`` skips this part). The newer
``nvmlDeviceGetProcessesUtilizationInfo`` (same samples, versioned struct) is timed beside
the older call, to see whether either is cheaper. Prints a table; writes JSON to
$WATTLAB_BENCH_RESULTS or ".".
Read-only on the card.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LOAD = """import time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + float(__import__("sys").argv[1])
while time.monotonic() < end:
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    time.sleep(0.002)
"""
PAUSES_S = (1.0, 3.0, 6.0, 12.0, 24.0, 40.0)


def cpu_us(call: Any, n: int) -> float:
    """Median CPU µs of one call over ``n`` back-to-back calls."""
    costs = []
    for _ in range(n):
        t0 = time.process_time_ns()
        with contextlib.suppress(Exception):  # a refused call is timed as it answers
            call()
        costs.append((time.process_time_ns() - t0) / 1e3)
    return statistics.median(costs)


def utilisation(nvml: Any, handle: Any, last_us: int) -> list[Any]:
    try:
        return list(nvml.nvmlDeviceGetProcessUtilization(handle, last_us))
    except nvml.NVMLError as e:
        if "Not Found" in str(e):
            return []
        raise


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--loads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--no-pauses", action="store_true", help="time the calls only")
    args = ap.parse_args()
    import pynvml as nvml

    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(args.gpu)
    pauses_s = () if args.no_pauses else PAUSES_S
    total_s = sum(pauses_s) + 30
    loads = [subprocess.Popen([sys.executable, "-c", LOAD, str(total_s)])
             for _ in range(args.loads)]
    try:
        time.sleep(8)
        now_us = time.time_ns() // 1000
        calls = {
            "GetProcessUtilization(last 1 s)": lambda: utilisation(nvml, h, now_us - 1_000_000),
            "GetProcessUtilization(all kept)": lambda: utilisation(nvml, h, 0),
            "GetProcessesUtilizationInfo(last 1 s)":
                lambda: nvml.nvmlDeviceGetProcessesUtilizationInfo(h, now_us - 1_000_000),
            "GetComputeRunningProcesses": lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h),
            "GetGraphicsRunningProcesses": lambda: nvml.nvmlDeviceGetGraphicsRunningProcesses(h),
            "GetPowerUsage": lambda: nvml.nvmlDeviceGetPowerUsage(h),
            "GetTotalEnergyConsumption": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h),
        }
        costs = {name: cpu_us(call, args.calls) for name, call in calls.items()}
        print(f"{'call':40s} {'CPU us (median of ' + str(args.calls) + ')':>24s}")
        for name, us in costs.items():
            print(f"{name:40s} {us:24.1f}")
        every = utilisation(nvml, h, 0)
        depth = {"samples_kept": len(every),
                 "span_s": (max(s.timeStamp for s in every) - min(s.timeStamp for s in every))
                 / 1e6 if every else None}
        print(f"driver keeps {depth['samples_kept']} samples over {depth['span_s']} s")
        last_us = max((s.timeStamp for s in every), default=now_us)
        pauses = []
        for pause_s in pauses_s:
            time.sleep(pause_s)
            got = sorted(utilisation(nvml, h, last_us), key=lambda s: s.timeStamp)
            stamps = sorted({s.timeStamp for s in got})
            steps = [b - a for a, b in itertools.pairwise(stamps)]
            step_us = statistics.median(steps) if steps else None
            first_gap_s = (stamps[0] - last_us) / 1e6 if stamps else None
            pauses.append({"pause_s": pause_s, "samples": len(got), "stamps": len(stamps),
                           "pids": len({s.pid for s in got}),
                           "median_step_ms": step_us / 1e3 if step_us else None,
                           "span_s": (stamps[-1] - stamps[0]) / 1e6 if stamps else None,
                           "first_after_last_s": first_gap_s})
            print(f"after {pause_s:5.1f} s: {pauses[-1]}")
            if stamps:
                last_us = stamps[-1]
    finally:
        for p in loads:
            p.kill()
            p.wait()
    out = Path(os.environ.get("WATTLAB_BENCH_RESULTS", "."))
    doc = {"gpu": nvml.nvmlDeviceGetName(h), "cpu_us": costs, "kept": depth, "pauses": pauses}
    (out / "process_calls.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
