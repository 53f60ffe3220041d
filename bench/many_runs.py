"""Many run files: `wattlab energy` and `info FOLDER --jobs 2` against reading them with h5py.

    python bench/many_runs.py                 # 100 files of `wattlab demo` size
    python bench/many_runs.py --quick         # 10 files of a 5 s demo, once
    python bench/many_runs.py --keep /tmp/demo.h5   # make the demo file once, reuse it
    python bench/many_runs.py --per-file 40 --keep /tmp/demo.h5   # CPU of one file, in-process

One `wattlab demo` file (20 s: a 20 kHz PowerSensor3 stream, NVML, a wall meter; 40 MB) is
linked ``--files`` times into a folder (hard links: the same bytes, so every contender reads
from the page cache alike). The floor is two worker processes that read every dataset of
every file once with h5py; the contenders are `wattlab energy FOLDER --jobs 2` (the full
analysis) and `wattlab info FOLDER --jobs 2` (the per-source summary), run in turn with
the floor in each repeat. Wall time and the peak resident memory of the energy process
tree (the largest process and the sum over the parent and its workers) are reported;
median of ``--repeat``.

``--per-file N``: instead, the CPU time of one file's plain `wattlab energy` report and of
the floor's read, in this process as a worker runs them (no read-ahead thread, freed
memory kept, one BLAS thread): the least over 6 rounds of the mean of N calls. CPU time in
one process is little changed by other work on the machine, unlike the wall time above.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import median, write_json

READ = """
import h5py

def read(path):
    n = 0
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            nonlocal n
            if isinstance(obj, h5py.Dataset):
                n += obj[()].nbytes
        f.visititems(visit)
    return n
"""
FLOOR = """
import sys
from concurrent.futures import ProcessPoolExecutor
""" + READ + """
with ProcessPoolExecutor(2) as pool:
    print(sum(pool.map(read, sys.argv[1:])))
"""
PER_FILE_ROUNDS = 6


def timed(argv: list[str]) -> float:
    """Wall seconds of a command."""
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", help="demo file to make once and reuse")
    ap.add_argument("--quick", action="store_true", help="10 files of a 5 s demo, once")
    ap.add_argument("--per-file", type=int, metavar="N",
                    help="CPU of one file's report and read, mean of N calls, in-process")
    args = ap.parse_args()
    if args.quick:
        args.files, args.repeat = 10, 1
    with tempfile.TemporaryDirectory() as tmp:
        demo = Path(args.keep or Path(tmp) / "demo.h5")
        if not demo.exists():
            made = subprocess.run([sys.executable, "-m", "wattlab.cli", "demo", "-o",
                                   str(demo), *(["--duration", "5"] if args.quick else [])],
                                  check=False, stdout=subprocess.DEVNULL)
            # 1: frames lost on a busy machine, each a gap row: the file is whole, and a
            # file with gaps is as good an input to time the analysis on
            if made.returncode not in (0, 1) or not demo.exists():
                raise SystemExit(f"wattlab demo failed: exit status {made.returncode}")
        if args.per_file:
            per_file_cpu(demo, args.per_file)
            return
        folder = Path(tmp) / "runs"
        folder.mkdir()
        for i in range(args.files):
            os.link(demo, folder / f"run{i:03d}.h5")
        files = sorted(str(p) for p in folder.iterdir())
        floor_cmd = [sys.executable, "-c", FLOOR, *files]
        cmds = {"h5py": floor_cmd, **{verb: [sys.executable, "-m", "wattlab.cli", verb,
                                             str(folder), "--jobs", "2", "--json"]
                                      for verb in ("energy", "info")}}
        runs: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(args.repeat):
            for name, cmd in cmds.items():
                runs[name].append(timed(cmd))
        peak = peak_tree_mb(cmds["energy"])
        file_mb = demo.stat().st_size / 1e6
    wall = {name: median(times) for name, times in runs.items()}
    print(f"{args.files} demo files ({file_mb:.0f} MB each), 2 processes, "
          f"median of {args.repeat}")
    print(f"{'reader':<36} {'wall s':>8} {'ratio':>7}")
    for name, label in (("h5py", "h5py, every dataset once"),
                        ("energy", "wattlab energy FOLDER --jobs 2"),
                        ("info", "wattlab info FOLDER --jobs 2")):
        print(f"{label:<36} {wall[name]:8.2f} {wall[name] / wall['h5py']:7.2f}")
    print(f"peak memory of wattlab energy: {peak['largest_mb']:.0f} MB largest process, "
          f"{peak['tree_mb']:.0f} MB parent + workers at once (goal: 1.2x, 1 GB)")
    write_json("many_runs", {"quick": args.quick, "files": args.files, "file_mb": file_mb,
                             "h5py_s": runs["h5py"], "energy_s": runs["energy"],
                             "info_s": runs["info"], "ratio": wall["energy"] / wall["h5py"],
                             "info_ratio": wall["info"] / wall["h5py"], **peak})


def per_file_cpu(demo: Path, calls: int) -> None:
    """CPU ms of one file's `energy` report and of the floor's read, as a worker does them."""
    from wattlab.runtime_env import quiet_math_threads

    quiet_math_threads()  # before numpy: as the CLI runs
    from functools import partial

    from wattlab.analysis import alignment
    from wattlab.analysis.many_runs import _keep_freed_memory
    from wattlab.commands.energy import report_of

    alignment.READ_AHEAD = False
    _keep_freed_memory()
    floor: dict[str, Any] = {}
    exec(READ, floor)  # the floor's own reader
    jobs = {"energy": partial(report_of, options={"by_marker": False, "reference": None,
                                                  "windows": []}, records=[]),
            "h5py": floor["read"]}
    best = {}
    for name, job in jobs.items():
        job(str(demo))  # warm: page cache, imports
        means = []
        for _ in range(PER_FILE_ROUNDS):
            t0 = time.process_time()
            for _ in range(calls):
                job(str(demo))
            means.append((time.process_time() - t0) / calls * 1e3)
        best[name] = min(means)
        print(f"{name:<8} CPU per file {best[name]:6.2f} ms (rounds: "
              f"{' '.join(f'{m:.2f}' for m in means)})")
    print(f"energy / h5py: {best['energy'] / best['h5py']:.2f}")
    write_json("many_runs_per_file", {"calls": calls, "energy_ms": best["energy"],
                                      "h5py_ms": best["h5py"]})


def peak_tree_mb(argv: list[str]) -> dict[str, float]:
    """Sample the RSS of the process and its children every 50 ms: the largest and the sum."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    largest = tree = 0.0
    while proc.poll() is None:
        pids = [proc.pid, *children(proc.pid)]
        sizes = [rss_mb(p) for p in pids]
        largest, tree = max(largest, *sizes), max(tree, sum(sizes))
        time.sleep(0.05)
    return {"largest_mb": largest, "tree_mb": tree}


def children(pid: int) -> list[int]:
    from common import child_pids

    out, todo = [], [pid]
    while todo:
        kids = child_pids(todo.pop())
        out += kids
        todo += kids
    return out


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


if __name__ == "__main__":
    main()
