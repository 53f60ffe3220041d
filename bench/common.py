"""Shared bits of the benchmarks: where results go, and the machine they ran on."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wattlab.drivers.nvml import NvmlDriver

HERE = Path(__file__).resolve().parent
# exit status of a benchmark that ran and wrote its result but missed a goal (1 is a crash):
# a loaded machine misses real-time goals without a defect, a crash is always one
GOALS_MISSED = 3
# the real data the tests and benchmarks read, shipped with the repository
DATA = HERE.parent / "tests" / "data"
# WATTLAB_BENCH_RESULTS: elsewhere (the test suite's quick run must not replace full results)
RESULTS = Path(os.environ.get("WATTLAB_BENCH_RESULTS")
               or HERE / "results")


def child_pids(pid: int) -> list[int]:
    """The live children of a process, from /proc (none if it has ended)."""
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    except OSError:
        return []


def process_cpu_clock(pid: int) -> int:
    """Linux's clock id for a process's CPU time, all its threads, to the nanosecond.

    ``/proc/<pid>/stat`` counts in 10 ms ticks: one tick is 0.03 % of a core over a 30 s
    window, as large as the differences between frugal readers.
    """
    return ((~pid) << 3) | 2  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds used so far by a live process and its live descendants."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += time.clock_gettime(process_cpu_clock(p))
        except OSError:
            continue  # it ended in between
        todo += child_pids(p)
    return total


def machine() -> dict[str, Any]:
    """Which machine, when, at which commit: every result row carries this."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False, cwd=HERE).stdout.strip()
    except OSError:
        commit = ""
    # a copied working tree (the lent GPU machine) may carry a stale .git: say it
    commit = os.environ.get("WATTLAB_COMMIT", commit)
    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "commit": commit}


def write_json(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({**result, "machine": machine()}, indent=2, default=float))
    return path


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def open_nvml(simulate: bool) -> NvmlDriver:
    """An opened NVML driver: the real library, or one simulated GPU (``--simulate``)."""
    from wattlab.drivers.nvml import NvmlDriver

    lib = None
    if simulate:
        from wattlab.hardware.fake_nvml import FakeNvml
        from wattlab.hardware.simulated_gpu import simulated_gpus

        lib = FakeNvml(simulated_gpus(1, 0))
    driver = NvmlDriver(lib)
    driver.open()
    return driver


def doc_parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser whose ``--help`` is its module docstring, laid out as written."""
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
