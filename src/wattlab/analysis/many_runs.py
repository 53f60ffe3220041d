"""Many run files at once: folders expanded, each file analysed in a worker process.

Why processes: the analysis of one file is NumPy and h5py work that holds the GIL for
long stretches, and HDF5 serialises its calls within a process; separate processes use
every core. Memory stays bounded because a worker holds one file's analysis at a time
(the readers stream a file in slices) and sends back only its small result; at most
``jobs`` results wait in the parent (results come back in input order). Workers are
forked on Linux, so they start with the parent's imports; with as many workers as cores
they read without a read-ahead thread (no core is free to run it).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from wattlab.arg_types import JOBS
from wattlab.errors import UsageError, WattlabError

RUN_SUFFIXES = (".h5", ".hdf5")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
KEEP_BLOCKS_BYTES = 1 << 26  # blocks up to this size come from (and go back to) the heap
T = TypeVar("T")


def default_jobs() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def add_runs_arguments(p: argparse.ArgumentParser, what: str = "run file") -> None:
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help=f"{what}(s), or folders of them (*.h5 at any depth)")
    p.add_argument("--jobs", "-j", type=JOBS, metavar="N",
                   help="worker processes for several files (default: one per CPU)")


def expand_runs(paths: list[str]) -> list[str]:
    """Files as given, folders as every run file under them (sorted); no duplicates."""
    out: list[str] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*") if p.suffix in RUN_SUFFIXES
                           and p.is_file())
            if not found:
                raise UsageError(f"{text}: folder holds no run file ({', '.join(RUN_SUFFIXES)})")
            out += found
        elif path.exists():
            out.append(text)
        else:
            raise UsageError(f"{text}: no such file or folder")
    return list(dict.fromkeys(out))


@dataclass
class Outcome:
    """One file's result, or the error that stopped it (``usage``: a bad input file)."""

    path: str
    result: Any = None
    error: str = ""
    usage: bool = False


def _guarded(work: Callable[[str], Any], path: str) -> Outcome:
    try:
        return Outcome(path, work(path))
    except WattlabError as e:
        text = str(e) if path in str(e) else f"{path}: {e}"
        return Outcome(path, error=text, usage=isinstance(e, UsageError))


def _start_worker(read_ahead: bool) -> None:
    from wattlab.analysis import alignment

    alignment.READ_AHEAD = read_ahead
    _keep_freed_memory()


def _keep_freed_memory() -> None:
    """Have glibc's malloc keep freed memory for the next file instead of returning it.

    Why: each file's slices are a few MB of fresh arrays; by default glibc gives such
    blocks back to the kernel when they are freed, and every page of the next file's
    arrays is then faulted in and zeroed again (~7 ms of a demo file's ~33 ms of CPU).
    What is kept is at most the worker's own peak. Without glibc: nothing is changed.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, KEEP_BLOCKS_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * KEEP_BLOCKS_BYTES)
    except (OSError, AttributeError):
        pass


def map_runs(work: Callable[[str], T], paths: list[str], jobs: int | None = None
             ) -> Iterator[Outcome]:
    """``work(path)`` for each file, in worker processes, yielded in input order.

    ``work`` must be a module-level function (it is sent to the workers by name). One file,
    or ``jobs=1``, runs here without a pool.
    """
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    if jobs == 1 or len(paths) == 1:
        for path in paths:
            yield _guarded(work, path)
        return
    workers = min(jobs, len(paths))
    fork = sys.platform.startswith("linux")  # elsewhere forking is unsafe or absent
    with ProcessPoolExecutor(max_workers=workers, initializer=_start_worker,
                             initargs=(workers < default_jobs(),),
                             mp_context=multiprocessing.get_context("fork" if fork else None)
                             ) as pool:
        pending: list[Future[Outcome]] = []
        todo = iter(paths)
        for path in todo:  # a bounded window: at most 2 × jobs files in flight
            pending.append(pool.submit(_guarded, work, path))
            if len(pending) >= 2 * jobs:
                break
        while pending:
            done = pending.pop(0).result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.submit(_guarded, work, nxt))
            yield done


def json_item(work: Callable[[str], Any], path: str) -> str:
    """``work(path)`` as ``json.dumps(results, indent=2)`` writes it as an item of the list.

    Why in the workers: with an indent, json encodes in Python (~0.25 ms a demo file's
    energy report), and the parent doing it for every file after the workers are done is
    time no other core shares. ``json_list`` joins the items.
    """
    return "\n".join("  " + line for line in json.dumps(work(path), indent=2).split("\n"))


def json_list(items: list[str]) -> str:
    """Items of ``json_item`` as ``json.dumps(results, indent=2)`` writes their list."""
    return "[\n" + ",\n".join(items) + "\n]" if items else "[]"


def report_errors(outcomes: list[Outcome]) -> int:
    """Say which files failed and why (standard error); the exit status they make."""
    status = 0
    for o in outcomes:
        if o.error:
            print(f"wattlab: error: {o.error}", file=sys.stderr)
            status = max(status, 2 if o.usage else 1)
    return status
