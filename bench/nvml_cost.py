"""Where the NVML reader's CPU goes, on a real GPU (read-only).

    python bench/nvml_cost.py [--seconds 20]

1. The cost of each NVML call the reader makes (median and 99th percentile, µs).
2. A recording session of the GPU: CPU of the NVML source thread, of the session process
   as a whole, and of the recorder process, as % of one core.
Without a GPU it measures the simulated one (then the call costs are the simulator's).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from common import write_json
from wattlab.acquisition.nvml_source import NvmlAcquirer
from wattlab.acquisition.session import Session
from wattlab.drivers.nvml import NvmlDriver


def call_costs(driver: NvmlDriver, n: int) -> dict[str, dict[str, float]]:
    calls = {
        "read_samples (drain)": lambda: driver.read_samples(0, int(time.time() * 1e6) - 2_000_000),
        "read_power (instant + average)": lambda: driver.read_power(0),
        "read_energy_j": lambda: driver.read_energy_j(0),
        "read_state": lambda: driver.read_state(0),
    }
    out = {}
    for name, fn in calls.items():
        fn()
        costs = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            costs.append((time.perf_counter_ns() - t0) / 1000)
        out[name] = {"median_us": float(np.median(costs)),
                     "p99_us": float(np.percentile(costs, 99))}
    return out


class CpuProbe:
    """Samples the source thread's CPU clock while the session runs."""

    def __init__(self) -> None:
        self.thread_s = 0.0

    def __call__(self, elapsed_s: float) -> None:
        for thread in threading.enumerate():
            if thread.name == "source-gpu0" and thread.ident:
                self.thread_s = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--simulate", action="store_true")
    args = parser.parse_args()
    lib = None
    if args.simulate:
        from wattlab.hardware.fake_nvml import FakeNvml
        from wattlab.hardware.simulated_gpu import simulated_gpus

        lib = FakeNvml(simulated_gpus(1, 0))
    driver = NvmlDriver(lib)
    driver.open()
    costs = call_costs(driver, 200)
    with tempfile.TemporaryDirectory() as folder:
        probe = CpuProbe()
        cpu0 = time.process_time()
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        Session(str(Path(folder) / "cost.h5"), [("gpu0", NvmlAcquirer(driver, 0))],
                duration_s=args.seconds, on_progress=probe).run()
        wall_s = time.monotonic() - t0
        session_s = time.process_time() - cpu0
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    driver.close()
    recorder_s = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime
                                                              + children0.ru_stime)
    print(f"NVML call costs ({'simulated' if args.simulate else 'real'} GPU), 200 calls each")
    print(f"{'call':<34} {'median us':>10} {'p99 us':>10}")
    for name, c in costs.items():
        print(f"{name:<34} {c['median_us']:>10.1f} {c['p99_us']:>10.1f}")
    cpu = {"source_thread_pct": 100 * probe.thread_s / args.seconds,
           "session_process_pct": 100 * session_s / wall_s,
           "recorder_process_pct": 100 * recorder_s / wall_s}
    print(f"recording {args.seconds:g} s: source thread {cpu['source_thread_pct']:.2f} %, "
          f"session process {cpu['session_process_pct']:.2f} %, recorder process "
          f"{cpu['recorder_process_pct']:.2f} % of one core (process figures include start-up)")
    write_json("nvml_cost", {"benchmark": "nvml_cost", "simulated": args.simulate,
                             "calls": costs, "cpu": cpu, "seconds": args.seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
