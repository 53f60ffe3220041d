"""The NVML reader against its floor and nvidia-smi, side by side, median of runs (issue 39).

    python bench/nvml_floor.py --out DIR [--seconds 60] [--runs 3] [--gpu 0]   # a real GPU
    python bench/nvml_floor.py --out DIR --simulate [--seconds 2 --runs 1]     # the fake NVML

Each run starts, at the same time and for the same steady window (``--seconds`` after a
``--warmup``), every reader as its own process tree:

- the floor: loops doing only the NVML calls wattlab makes, on its cadences and nothing
  else (no rows, no bus, no file): each stream's calls alone (power every 90 ms, the drain
  and the state every 0.9 s, the energy counter every 9 s), the default schedule (all four,
  one wake-up serving every read due) and the frugal one (drain 1.8 s, energy 60 s);
- ``wattlab record --nvml GPU`` (default: every stream) and the frugal recording
  (``--nvml-streams samples,energy --nvml-intervals drain=1.8,emit=12,energy=60``);
- ``nvidia-smi --query-gpu=timestamp,power.draw --format=csv -lms 100`` (not with
  ``--simulate``: there is no nvidia-smi to compare).

CPU is each tree's CPU clock (all threads, to the nanosecond) over the window, % of one
core; the table gives the median over ``--runs`` and each run's figure. Before the runs it
also compares, on the GPU, reading the 1 s average through ``nvmlDeviceGetPowerUsage``
(what wattlab records) with the field ``NVML_FI_DEV_POWER_AVERAGE`` read with the instant
field in one call: how often the two agree, and the CPU of one call against two after a
90 ms sleep, so whether one call may replace two can be decided on data. JSON goes to
``DIR/nvml_floor.json``, the run files and nvidia-smi's log beside it. About 4 minutes with
the defaults.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import doc_parser, machine, median, tree_cpu_s
from wattlab.acquisition.acquirers import FRUGAL_INTERVALS
from wattlab.acquisition.acquirers.nvml_cadence import DEFAULT_INTERVALS_S, parse_intervals

HERE = Path(__file__).resolve().parent
FRUGAL_FLAGS = ["--nvml-streams", "samples,energy", "--nvml-intervals", FRUGAL_INTERVALS]
# the floor's loops: name -> (calls, cadences other than the defaults)
FLOOR_LOOPS = {
    "calls: power 90 ms": ("power", ""),
    "calls: drain 0.9 s": ("drain", ""),
    "calls: state 0.9 s": ("state", ""),
    "calls: energy 9 s": ("energy", ""),
    "calls: default schedule": ("power,drain,state,energy", ""),
    "calls: frugal schedule": ("drain,energy", FRUGAL_INTERVALS),
}
DEFAULT, FRUGAL, SMI = "wattlab default", "wattlab frugal", "nvidia-smi -lms 100"
STOP_WAIT_S = 60.0
# how a reader ends on SIGTERM: 0, killed by it, or wattlab's "interrupted" (128 + SIGINT)
STOPPED = (0, -signal.SIGTERM, 130)


# ------------------------------------------------------------------ the floor's loop (child)

def calls_loop(calls: list[str], intervals: str, gpu: int, simulate: bool) -> None:
    """Make only the NVML calls of ``calls`` on their cadences until SIGTERM."""
    from common import open_nvml

    driver = open_nvml(simulate)
    step_ns = {**{k: round(v * 1e9) for k, v in DEFAULT_INTERVALS_S.items()},
               **{k: round(v * 1e9) for k, v in parse_intervals(intervals).items()}}
    read = {"power": lambda: driver.read_power(gpu), "state": lambda: driver.read_state(gpu),
            "energy": lambda: driver.read_energy_j(gpu)}
    last_seen_us = time.time_ns() // 1000

    def drain() -> None:
        nonlocal last_seen_us
        stamps, _ = driver.read_samples(gpu, last_seen_us)
        if stamps.shape[0]:
            last_seen_us = int(stamps[-1])

    read["drain"] = drain
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    now = time.monotonic_ns()
    due = {c: now + (step_ns[c] if c == "drain" else 0) for c in calls}
    while running[0]:
        wait_ns = min(due.values()) - time.monotonic_ns()
        if wait_ns > 0:
            time.sleep(wait_ns / 1e9)
        now = time.monotonic_ns()
        for call, at in due.items():
            if at <= now:
                read[call]()
                nxt = at + step_ns[call]
                due[call] = nxt if nxt > now else now + step_ns[call]
    driver.close()


# ------------------------------------------------------------------ one side-by-side run

def readers(args: argparse.Namespace, folder: Path, run: int) -> dict[str, list[str]]:
    """Every reader of one run: name -> command line."""
    py = sys.executable
    me = [py, str(Path(__file__).resolve())]
    sim = ["--simulate"] if args.simulate else []
    source = ["--simulate"] if args.simulate else ["--nvml", str(args.gpu)]
    out = {name: [*me, "--calls", calls, "--intervals", intervals, "--gpu", str(args.gpu), *sim]
           for name, (calls, intervals) in FLOOR_LOOPS.items()}
    for name, flags in ((DEFAULT, []), (FRUGAL, FRUGAL_FLAGS)):
        file = folder / f"run{run}-{name.split()[1]}.h5"
        out[name] = [py, "-m", "wattlab.cli", "record", *source, *flags, "--duration", "3600",
                     "-o", str(file)]
    if not args.simulate:
        out[SMI] = ["nvidia-smi", f"--id={args.gpu}", "--query-gpu=timestamp,power.draw",
                    "--format=csv", "-lms", "100"]
    return out


def one_run(args: argparse.Namespace, folder: Path, run: int) -> dict[str, Any]:
    """Start every reader, measure the steady window, stop them: CPU % and readings/s."""
    commands = readers(args, folder, run)
    smi_log = folder / f"run{run}-smi.csv"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with open(smi_log, "wb") as smi_out:
        for name, cmd in commands.items():
            procs[name] = subprocess.Popen(cmd, stdout=smi_out if name == SMI
                                           else subprocess.DEVNULL, stderr=subprocess.PIPE)
        files = [Path(commands[name][-1]) for name in (DEFAULT, FRUGAL)]
        deadline = time.monotonic() + STOP_WAIT_S
        while not all(f.exists() for f in files) and time.monotonic() < deadline:
            time.sleep(0.2)  # a loaded machine: the recordings start before the window does
        time.sleep(args.warmup)  # imports, NVML init, the recorder's start stay out
        t0 = time.monotonic()
        cpu0 = {name: tree_cpu_s(p.pid) for name, p in procs.items()}
        time.sleep(args.seconds)
        cpu1 = {name: tree_cpu_s(p.pid) for name, p in procs.items()}
        window_s = time.monotonic() - t0
        failed: dict[str, str] = {}
        stderr: dict[str, str] = {}
        for name, p in procs.items():
            if p.poll() is not None:
                failed[name] = f"exited {p.returncode} during the window"
            p.send_signal(signal.SIGTERM)
        for name, p in procs.items():
            try:
                _, err = p.communicate(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            stderr[name] = f"rc {p.returncode}: " + err.decode(errors="replace")[-300:]
            if p.returncode not in STOPPED and name not in failed:
                failed[name] = f"exit {p.returncode}: {stderr[name]}"
    rows = {name: {"cpu_pct": 100 * (cpu1[name] - cpu0[name]) / window_s} for name in procs}
    for name in (DEFAULT, FRUGAL):
        rate = rows[name]["samples_per_s"] = samples_per_s(Path(commands[name][-1]))
        if math.isnan(rate):
            failed.setdefault(name, f"no driver samples in its run file: {stderr[name]}")
    if SMI in rows:
        lines = [ln for ln in smi_log.read_text().splitlines()[1:] if ln.strip()]
        rows[SMI]["readings_per_s"] = len(lines) / (window_s + args.warmup)
    return {"window_s": window_s, "rows": rows, "failed": failed,
            "commands": {n: " ".join(c) for n, c in commands.items()}}


def samples_per_s(path: Path) -> float:
    """Driver samples a second in a recording's ``*.samples`` stream (NaN if none)."""
    import wattlab
    from wattlab.errors import WattlabError

    try:
        with wattlab.open(str(path)) as run:
            t = next(v.time_ns for sid, v in run.sources.items() if sid.endswith(".samples"))
    except (StopIteration, OSError, WattlabError) as e:
        print(f"{path.name}: no samples ({e})")
        return math.nan
    return (len(t) - 1) / ((t[-1] - t[0]) / 1e9) if len(t) > 1 else math.nan


# ------------------------------------------------------------------ one call or two

def one_call_or_two(gpu: int, reads: int, simulate: bool) -> dict[str, Any]:
    """The 1 s average by ``nvmlDeviceGetPowerUsage`` against the field, and the CPU of one
    call for instant + average against two, each after a 90 ms sleep (alternated)."""
    import pynvml

    from common import open_nvml

    driver = open_nvml(simulate)
    lib, handle = driver.lib, driver.handle(gpu)
    fields = (pynvml.c_nvmlFieldValue_t * 2)()
    fields_fn = lib._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    two = ctypes.c_int32(2)
    cpu_us: dict[str, list[float]] = {"one call (two fields)": [], "two calls (wattlab)": []}
    equal = 0
    for _ in range(reads):
        for how, spent in cpu_us.items():
            time.sleep(0.09)
            t0 = time.thread_time_ns()
            if how.startswith("one"):
                fields[0].fieldId = pynvml.NVML_FI_DEV_POWER_INSTANT
                fields[1].fieldId = pynvml.NVML_FI_DEV_POWER_AVERAGE
                fields_fn(handle, two, fields)
            else:
                driver.read_power(gpu)
            spent.append((time.thread_time_ns() - t0) / 1e3)
        fields_fn(handle, two, fields)  # the two averages back to back
        usage_mw = lib.nvmlDeviceGetPowerUsage(handle)
        equal += (fields[1].nvmlReturn == pynvml.NVML_SUCCESS
                  and fields[1].value.uiVal == usage_mw)
    driver.close()
    return {"reads": reads, "average_field_equals_power_usage": equal,
            "cpu_us_median": {k: median(v) for k, v in cpu_us.items()}}


# ------------------------------------------------------------------ main

def report(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs, each run's figure, and the issue's goals."""
    names = list(runs[0]["rows"])
    table = {}
    for name in names:
        cpu = [r["rows"][name]["cpu_pct"] for r in runs]
        table[name] = {"cpu_pct_median": median(cpu), "cpu_pct_runs": cpu,
                       **{k: median([r["rows"][name][k] for r in runs])
                          for k in ("samples_per_s", "readings_per_s")
                          if k in runs[0]["rows"][name]}}
    med = {n: row["cpu_pct_median"] for n, row in table.items()}
    goals: dict[str, Any] = {
        "default / floor (goal <= 1.5)": med[DEFAULT] / med["calls: default schedule"],
        "frugal / floor": med[FRUGAL] / med["calls: frugal schedule"],
    }
    if SMI in med:
        goals["default / nvidia-smi -lms 100 (goal <= 2)"] = med[DEFAULT] / med[SMI]
        goals["frugal / nvidia-smi -lms 100 (goal <= 1)"] = med[FRUGAL] / med[SMI]
    return {"table": table, "goals": goals}


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("--out", type=Path, help="folder for nvml_floor.json and the run files")
    parser.add_argument("--seconds", type=float, default=60.0, help="steady window per run")
    parser.add_argument("--warmup", type=float, default=6.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--simulate", action="store_true", help="the fake NVML, no nvidia-smi")
    parser.add_argument("--compare-reads", type=int, default=60,
                        help="reads of the one-call/two-call comparison")
    parser.add_argument("--calls", help=argparse.SUPPRESS)  # a floor loop (child mode)
    parser.add_argument("--intervals", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calls:
        calls_loop(args.calls.split(","), args.intervals, args.gpu, args.simulate)
        return 0
    if args.out is None:
        parser.error("--out DIR is required")
    args.out.mkdir(parents=True, exist_ok=True)
    compare = one_call_or_two(args.gpu, args.compare_reads, args.simulate)
    with tempfile.TemporaryDirectory(prefix="wattlab-floor-", dir=args.out) as tmp:
        runs = [one_run(args, Path(tmp), i) for i in range(args.runs)]
        for f in Path(tmp).iterdir():
            f.replace(args.out / f.name)
    result = {"benchmark": "nvml_floor", "simulate": args.simulate, "seconds": args.seconds,
              "runs": runs, "one_call_or_two": compare, **report(runs), "machine": machine()}
    (args.out / "nvml_floor.json").write_text(json.dumps(result, indent=2, default=float))
    print(f"NVML reader against its floor{'' if args.simulate else ' and nvidia-smi'}: "
          f"{args.runs} run(s) of {args.seconds:g} s steady, all readers at once"
          f"{' (fake NVML)' if args.simulate else ''}")
    print(f"{'reader':<26} {'CPU % median':>12} {'per run':>26} {'readings/s':>10}")
    for name, row in result["table"].items():
        rate = row.get("samples_per_s", row.get("readings_per_s"))
        per_run = ", ".join(f"{v:.3f}" for v in row["cpu_pct_runs"])
        print(f"{name:<26} {row['cpu_pct_median']:>12.3f} {per_run:>26} "
              f"{'-' if rate is None else f'{rate:.1f}':>10}")
    for goal, ratio in result["goals"].items():
        print(f"{goal}: {ratio:.2f}")
    print(f"1 s average: field == nvmlDeviceGetPowerUsage in "
          f"{compare['average_field_equals_power_usage']} of {compare['reads']} reads; CPU µs "
          "after a 90 ms sleep: " + ", ".join(f"{k} {v:.1f}"
                                               for k, v in compare["cpu_us_median"].items()))
    failed = {n: why for r in runs for n, why in r["failed"].items()}
    for name, why in failed.items():
        print(f"FAILED {name}: {why}")
    print(f"JSON and run files in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
