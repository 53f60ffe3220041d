"""Where the NVML reader's CPU goes, on a real GPU (read-only).

    python bench/nvml_cost.py [--seconds 20]

1. The cost of each NVML call the reader makes: wall time (median and 99th percentile) and
   CPU time (mean), µs; a drain also after 0.1, 0.9 and 1.8 s of samples (is its cost per
   call or per sample?), and as pynvml's ``nvmlDeviceGetSamples`` drains (two NVML calls,
   the first only asking how many samples there are; ``SampleDrain`` makes one).
2. A recording session of the GPU, in steady state (after a warm-up): CPU of the NVML source
   thread, of the rest of the session process and of the recorder process, % of one core;
   once per configuration in ``--configs``: every NVML stream, ``samples,energy`` (lean),
   and lean with ``drain=1.8,emit=12,energy=60`` (frugal); and the mean CPU of each NVML
   call as the recording made it (after a sleep, not back to back as in 1).
Without a GPU it measures the simulated one (then the call costs are the simulator's).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pynvml

from common import child_pids, open_nvml, tree_cpu_s, write_json
from wattlab.acquisition.acquirers import (
    FRUGAL_INTERVALS,
    NvmlAcquirer,
    parse_intervals,
    parse_streams,
)
from wattlab.acquisition.session import Session
from wattlab.drivers.nvml import NvmlDriver
from wattlab.errors import UsageError


def after_sleep_costs(driver: NvmlDriver, n: int) -> dict[str, float]:
    """CPU µs of one instant + average read right after a sleep (median), per sleep length.

    A thread woken from a sleep runs on cold caches: the cost of waking, not of the call,
    can dominate a reader's CPU, which is why the cadences share wake-ups.
    """
    out = {}
    for pause_s in (0.0, 0.02, 0.09):
        cpu = []
        for _ in range(n):
            if pause_s:
                time.sleep(pause_s)
            t0 = time.thread_time_ns()
            driver.read_power(0)
            cpu.append((time.thread_time_ns() - t0) / 1000)
        out[f"after {pause_s * 1000:g} ms sleep"] = float(np.median(cpu))
    return out


def call_costs(driver: NvmlDriver, n: int) -> dict[str, dict[str, float]]:
    time.sleep(1.0)  # a simulated GPU starts with an empty buffer
    def drain_after(age_s: float) -> Callable[[], Any]:
        return lambda: driver.read_samples(0, int((time.time() - age_s) * 1e6))

    lib, handle = driver.lib, driver.handle(0)

    def pynvml_drain() -> Any:
        """What a pynvml user writes: two NVML calls, a Python object per sample."""
        since_us = int((time.time() - 0.9) * 1e6)
        _, samples = lib.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, since_us)
        return [(s.timeStamp, s.sampleValue.uiVal) for s in samples]

    c_samples = lib._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
    value_type, count = ctypes.c_uint(), ctypes.c_uint()

    def size_query() -> Any:
        """The first of pynvml's two calls: how many samples there are (no array)."""
        return c_samples(handle, ctypes.c_uint(pynvml.NVML_TOTAL_POWER_SAMPLES),
                         ctypes.c_ulonglong(int((time.time() - 0.9) * 1e6)),
                         ctypes.pointer(value_type), ctypes.pointer(count), None)

    calls = {
        "read_samples (drain)": drain_after(0.9),
        **{f"read_samples, {age_s:g} s of samples": drain_after(age_s) for age_s in (0.1, 1.8)},
        "pynvml nvmlDeviceGetSamples, 0.9 s": pynvml_drain,
        "its size query alone (NULL array)": size_query,
        "read_power (instant + average)": lambda: driver.read_power(0),
        "read_energy_j": lambda: driver.read_energy_j(0),
        "read_state": lambda: driver.read_state(0),
    }
    out = {}
    for name, fn in calls.items():
        fn()
        costs = []
        cpu0 = time.thread_time_ns()
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            costs.append((time.perf_counter_ns() - t0) / 1000)
        out[name] = {"median_us": float(np.median(costs)),
                     "p99_us": float(np.percentile(costs, 99)),
                     "cpu_us": (time.thread_time_ns() - cpu0) / 1000 / n}
    return out


class CpuProbe:
    """CPU clocks of the source thread, this process and the recorder, after a warm-up.

    Start-up (imports, NVML init, the recorder's first file writes) is excluded: the
    figures are the steady cost of a long recording. It runs in its own thread and wakes
    once a second, so it adds almost nothing to what it measures (a progress callback would
    make the session wake 20 times a second).
    """

    def __init__(self, warmup_s: float) -> None:
        self.warmup_s = warmup_s
        self.first: dict[str, float] | None = None
        self.last: dict[str, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-probe", daemon=True)
        self._t0 = time.monotonic()
        self._thread.start()

    def _read(self) -> dict[str, float]:
        thread_s = math.nan
        for thread in threading.enumerate():
            if thread.name == "source-gpu0" and thread.ident:
                thread_s = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        recorder_s = sum(map(tree_cpu_s, child_pids(os.getpid())))
        return {"t": time.monotonic() - self._t0, "thread": thread_s,
                "process": time.process_time(), "recorder": recorder_s,
                "probe": time.thread_time()}  # its own cost, left out of the session's

    def _run(self) -> None:
        if self._stop.wait(self.warmup_s):
            return
        self.first = self._read()
        while not self._stop.wait(1.0):
            self.last = self._read()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def percent(self) -> dict[str, float]:
        """% of one core per part over the steady window."""
        if self.first is None or self.last is None or self.last["t"] <= self.first["t"]:
            raise SystemExit("recording too short for the warm-up: raise --seconds")
        span = self.last["t"] - self.first["t"]
        out = {k: 100 * (self.last[k] - self.first[k]) / span
               for k in ("thread", "process", "recorder", "probe")}
        out["process"] -= out["probe"]
        return {"source_thread_pct": out["thread"],
                "session_other_threads_pct": out["process"] - out["thread"],
                "recorder_process_pct": out["recorder"],
                "tree_pct": out["process"] + out["recorder"], "window_s": span}


Config = tuple[str, str, dict[str, float]]  # as given, the streams, the cadences


class InSituCalls:
    """The driver, adding up the thread CPU of each ``read_*`` call a recording makes.

    Back to back (``call_costs``) a call runs on warm caches; in a recording it comes after
    a sleep of up to seconds. The difference is what the source thread really pays.
    """

    def __init__(self, driver: NvmlDriver) -> None:
        self._driver = driver
        self.cpu_ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._driver, name)
        if not name.startswith("read_"):
            return attr

        def counted(*args: Any) -> Any:
            t0 = time.thread_time_ns()
            try:
                return attr(*args)
            finally:
                self.cpu_ns[name] = self.cpu_ns.get(name, 0) + time.thread_time_ns() - t0
                self.calls[name] = self.calls.get(name, 0) + 1

        return counted

    def mean_cpu_us(self) -> dict[str, float]:
        return {name: self.cpu_ns[name] / 1000 / n for name, n in self.calls.items()}


def steady_cpu(driver: NvmlDriver, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    """Record the GPU for ``args.seconds`` as ``config`` says; the steady CPU of each part,
    and the mean CPU of each kind of NVML call as the recording made it."""
    _, streams, intervals_s = config
    calls = InSituCalls(driver)
    with tempfile.TemporaryDirectory() as folder:
        probe = CpuProbe(args.warmup)
        acquirer = NvmlAcquirer(cast(NvmlDriver, calls), 0, streams=streams,
                                intervals_s=intervals_s)
        Session(str(Path(folder) / "cost.h5"), [("gpu0", acquirer)],
                duration_s=args.seconds).run()
        probe.stop()
    return {**probe.percent(), "in_situ_cpu_us": calls.mean_cpu_us()}


def configs_arg(text: str) -> list[Config]:
    """``STREAMS[@INTERVALS];...``, each checked before the GPU is touched."""
    configs = []
    try:
        for given in filter(None, (c.strip() for c in text.split(";"))):
            streams, _, intervals = given.partition("@")
            parse_streams(streams)
            configs.append((given, streams, parse_intervals(intervals)))
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return configs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds left out at the start")
    parser.add_argument("--simulate", action="store_true")
    parser.add_argument("--configs", type=configs_arg,
                        default=f"all;samples,energy;samples,energy@{FRUGAL_INTERVALS}",
                        help="sessions to measure, ';' between them: the NVML streams, then "
                             "after '@' the cadences that differ from the defaults")
    args = parser.parse_args()
    driver = open_nvml(args.simulate)
    costs = call_costs(driver, 200)
    steady = {config[0]: steady_cpu(driver, config, args) for config in args.configs}
    print(f"NVML call costs ({'simulated' if args.simulate else 'real'} GPU), 200 calls each")
    print(f"{'call':<38} {'median us':>10} {'p99 us':>10} {'CPU us':>10}")
    for name, c in costs.items():
        print(f"{name:<38} {c['median_us']:>10.1f} {c['p99_us']:>10.1f} {c['cpu_us']:>10.1f}")
    cold = after_sleep_costs(driver, 50)
    print("read_power CPU µs (median) " + ", ".join(f"{k}: {v:.1f}" for k, v in cold.items()))
    for config, cpu in steady.items():
        print(f"{config}: steady state over {cpu['window_s']:.1f} s (after "
              f"{args.warmup:g} s warm-up), % of one core: source thread "
              f"{cpu['source_thread_pct']:.2f}, rest of the session process "
              f"{cpu['session_other_threads_pct']:.2f}, recorder process "
              f"{cpu['recorder_process_pct']:.2f}; whole tree {cpu['tree_pct']:.2f}")
        print("  mean CPU µs of each call as the recording made it: " + ", ".join(
            f"{name} {cpu_us:.0f}" for name, cpu_us in cpu["in_situ_cpu_us"].items()))
    driver.close()
    write_json("nvml_cost", {"benchmark": "nvml_cost", "simulated": args.simulate,
                             "calls": costs,
                             "after_sleep_cpu_us": cold, "cpu_by_streams": steady,
                             "seconds": args.seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
