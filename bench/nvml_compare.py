"""NVML readers side by side on a real GPU, in one run, under one matrix-multiply load.

    python bench/nvml_compare.py [--phase-s 4]      # needs an NVIDIA GPU; read-only

Runs at the same time: the load (tests/with_device/matmul_load.py, which logs its phase
starts and reads the energy counter there: the reference), `wattlab record --nvml 0` (every
stream), `wattlab record --nvml 0 --nvml-streams samples,energy` (lean), the same with
`--nvml-intervals drain=1.8,emit=12,energy=60` (frugal: the least CPU),
`nvidia-smi --query-gpu=timestamp,power.draw --format=csv -lms 20`, a plain pynvml loop
polling nvmlDeviceGetPowerUsage every 100 ms, and Zeus's PowerMonitor (bench/zeus_reader.py)
where ``import zeus`` works (the GPU machine cannot fetch packages: carry Zeus and its
wheels, see BENCHMARKS.md). Per reader: distinct driver readings per second, CPU time (over
the run and steady), energy over the window against the energy counter, and the delay until
it shows the first idle -> full step.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import tree_cpu_s, write_json
from wattlab.acquisition.acquirers import FRUGAL_INTERVALS

HERE = Path(__file__).resolve().parent
LOAD = HERE.parent / "tests" / "with_device" / "matmul_load.py"
LEAN = ["--nvml-streams", "samples,energy"]
# each wattlab recording: (file name, extra flags, the label of its samples row)
WATTLAB_RUNS = {
    "wattlab": ("wattlab.h5", [], "wattlab gpu0.samples (50 Hz buffer)"),
    "wattlab lean": ("wattlab-lean.h5", LEAN, "wattlab lean: samples,energy only"),
    "wattlab frugal": ("wattlab-frugal.h5", [*LEAN, "--nvml-intervals", FRUGAL_INTERVALS],
                       f"wattlab frugal: samples,energy, {FRUGAL_INTERVALS}"),
}


def start(cmd: list[str], **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, **kw)  # type: ignore[call-overload]


def finish(proc: subprocess.Popen[bytes], stop: bool) -> float:
    """Stop (SIGTERM) if asked, reap, and return the CPU seconds it and its children used."""
    if stop and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


def read_smi(path: Path, gpu: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """'timestamp, power' lines, or 'timestamp, index, power' lines filtered to ``gpu``."""
    t, p = [], []
    for line in path.read_text().splitlines()[1:]:
        fields = [f.strip() for f in line.split(",")]
        try:
            if gpu is not None and int(fields[1]) != gpu:
                continue
            when = dt.datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f")
            t.append(int(when.replace(tzinfo=dt.datetime.now().astimezone().tzinfo)
                         .timestamp() * 1e9))
            p.append(float(fields[-1].split()[0]))
        except (ValueError, IndexError):
            continue
    return np.array(t, dtype=np.int64), np.array(p)


def read_loop(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """'unix_ns mW' lines (the pynvml loop's and Zeus's timelines)."""
    rows = np.loadtxt(path, dtype=np.int64, ndmin=2)
    return rows[:, 0], rows[:, 1] / 1000.0


def zeus_available() -> bool:
    try:
        import zeus.monitor  # noqa: F401
    except Exception as e:  # any import failure means: no peer to run
        print(f"nvml_compare: Zeus not run ({type(e).__name__}: {e})")
        return False
    return True


POWER_STREAMS = [("gpu0.power", "average_power_w"),
                 ("gpu0.power", "instant_power_w")]


def read_wattlab(path: Path, streams: list[tuple[str, str]]
                 ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    import wattlab

    with wattlab.open(str(path)) as run:
        unix0 = int(run.attrs["session_start_unix_ns"])
        out = {}
        for sid, ch in streams:
            view = run.source(sid)
            out[f"{sid}:{ch}"] = (view.time_ns + unix0, view.channel(ch))
    return out


def counter_window(path: Path, a_ns: int, b_ns: int, source: str = "gpu0.energy"
                   ) -> tuple[float, float]:
    """wattlab's own answer for the window: `wattlab energy --window` on its counter stream,
    edges between its reads placed by the samples; (J, ± J)."""
    import wattlab
    from wattlab.analysis.energy import energy_report

    with wattlab.open(str(path)) as run:
        unix0 = int(run.attrs["session_start_unix_ns"])
        report = energy_report(run, by_marker=False,
                               windows=[((a_ns - unix0) / 1e9, (b_ns - unix0) / 1e9)])
    row = next(r for r in report["rows"]
               if r["source"] == source and r["phase"] == "window")
    return row["energy_j"], row["uncertainty_j"]


def distinct_per_s(t: np.ndarray, p: np.ndarray, by_time: bool = False) -> float:
    keys = t if by_time else p
    changes = 1 + int(np.sum(keys[1:] != keys[:-1]))
    return changes / ((t[-1] - t[0]) / 1e9)


def window_energy(t: np.ndarray, p: np.ndarray, a: int, b: int) -> float:
    """Energy between unix ns a and b from readings held until the next one."""
    inside = (t >= a) & (t <= b)
    tt = np.concatenate(([a], t[inside], [b]))
    before = p[t < a]
    pp = np.concatenate(([before[-1] if before.size else p[inside][0]], p[inside]))
    return float(np.sum(pp * np.diff(tt)) / 1e9)


def step_delay_ms(t: np.ndarray, p: np.ndarray, step_ns: int, next_ns: int) -> float:
    """Time from the load step until a reading first passes halfway from idle to full."""
    idle = np.median(p[(t > step_ns - 3_000_000_000) & (t < step_ns)])
    full = np.median(p[(t > next_ns - 1_500_000_000) & (t < next_ns)])
    after = np.flatnonzero((t >= step_ns) & (p > (idle + full) / 2))
    return float((t[after[0]] - step_ns) / 1e6) if after.size else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--phase-s", type=float, default=4.0)
    args = parser.parse_args()
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as e:
        print(f"nvml_compare: skipped, no NVIDIA GPU here ({e})")
        return 0
    folder = Path(tempfile.mkdtemp(prefix="wattlab-nvml-"))
    smi_path = folder / "smi.csv"
    paths = {name: folder / file for name, (file, _, _) in WATTLAB_RUNS.items()}
    loop_path, steps_path = folder / "loop.txt", folder / "steps.txt"
    zeus_prefix = folder / "zeus"
    with_zeus = zeus_available()
    started = time.monotonic()
    with open(smi_path, "w") as smi_out:
        readers = {
            name: start([sys.executable, "-m", "wattlab.cli", "record", "--nvml", "0", *flags,
                         "--duration", "3600", "-o", str(paths[name])], stdout=subprocess.DEVNULL)
            for name, (_, flags, _) in WATTLAB_RUNS.items()}
        readers |= {
            "nvidia-smi -lms 20": start(["nvidia-smi", "--query-gpu=timestamp,power.draw",
                                         "--format=csv", "-lms", "20"], stdout=smi_out),
            "pynvml loop 100 ms": start([sys.executable, str(HERE / "nvml_poll_loop.py"),
                                         str(loop_path), "0.1"]),
        }
        if with_zeus:
            readers["zeus PowerMonitor"] = start([sys.executable, str(HERE / "zeus_reader.py"),
                                                  str(zeus_prefix)])
        time.sleep(5)  # start-up (imports, the recorder, NVML init) stays out of "steady"
        steady_from = {name: (time.monotonic(), tree_cpu_s(p.pid)) for name, p in readers.items()}
        load = start([sys.executable, str(LOAD), "--seconds", str(args.phase_s),
                      "--steps", str(steps_path)])
        load.wait()
        steady = {name: 100 * (tree_cpu_s(p.pid) - steady_from[name][1])
                  / (time.monotonic() - steady_from[name][0]) for name, p in readers.items()}
        time.sleep(2)
        cpu = {name: finish(proc, stop=True) for name, proc in readers.items()}
        wall_s = time.monotonic() - started
    steps = [(int(t), int(mj)) for t, _, mj in (line.split() for line in
                                                 steps_path.read_text().split("\n") if line)]
    wl = read_wattlab(paths["wattlab"], POWER_STREAMS)
    a, b = steps[0][0], steps[-1][0]
    counter_j = (steps[-1][1] - steps[0][1]) / 1e3
    step_ns, next_ns = steps[1][0], steps[2][0]
    series = {
        label: (*read_wattlab(paths[name], [("gpu0.samples", "power_w")])[
            "gpu0.samples:power_w"], True, name)
        for name, (_, _, label) in WATTLAB_RUNS.items()}
    series |= {
        "wattlab gpu0.power instant": (*wl["gpu0.power:instant_power_w"], False, "wattlab"),
        "wattlab gpu0.power average": (*wl["gpu0.power:average_power_w"], False, "wattlab"),
        "nvidia-smi -lms 20": (*read_smi(smi_path), False, "nvidia-smi -lms 20"),
        "pynvml loop 100 ms": (*read_loop(loop_path), False, "pynvml loop 100 ms"),
    }
    for domain in ("device_instant", "device_average"):
        timeline = Path(f"{zeus_prefix}.{domain}.txt")
        if with_zeus and timeline.exists():
            series[f"zeus PowerMonitor {domain}"] = (*read_loop(timeline), False,
                                                     "zeus PowerMonitor")
    rows = []
    for name, (t, p, by_time, proc) in series.items():
        energy = window_energy(t, p, a, b)
        rows.append({
            "reader": name, "distinct_per_s": distinct_per_s(t, p, by_time),
            "cpu_pct_of_core": 100 * cpu[proc] / wall_s, "steady_cpu_pct": steady[proc],
            "energy_j": energy, "energy_error_pct": 100 * (energy - counter_j) / counter_j,
            "step_delay_ms": step_delay_ms(t, p, step_ns, next_ns),
        })
    for proc, path in paths.items():
        energy, plus_minus = counter_window(path, a, b)
        rows.append({
            "reader": f"{proc} gpu0.energy, `energy --window`", "distinct_per_s": None,
            "cpu_pct_of_core": 100 * cpu[proc] / wall_s, "steady_cpu_pct": steady[proc],
            "energy_j": energy, "energy_error_pct": 100 * (energy - counter_j) / counter_j,
            "energy_uncertainty_pct": 100 * plus_minus / energy, "step_delay_ms": None,
        })
    print(f"NVML readers side by side, one run, {len(steps) - 1} load phases of {args.phase_s} s;"
          f" energy counter over the window: {counter_j:.1f} J")
    print(f"{'reader':<38} {'distinct/s':>10} {'CPU % run':>10} {'CPU % steady':>12} "
          f"{'energy err %':>12} {'step delay ms':>13}")
    for r in rows:
        print(f"{r['reader']:<38} {r['distinct_per_s'] or math.nan:>10.1f} "
              f"{r['cpu_pct_of_core']:>10.2f} {r['steady_cpu_pct']:>12.2f} "
              f"{r['energy_error_pct']:>12.2f} {r['step_delay_ms'] or math.nan:>13.0f}"
              + (f"  (± {r['energy_uncertainty_pct']:.2f} % stated)"
                 if "energy_uncertainty_pct" in r else ""))
    print("(CPU is each reader's whole process tree, % of one core: over the run, start-up "
          "included, and steady: while the load ran, from 5 s after start; wattlab's tree is "
          "its sources, recorder and HDF5 writing, one figure for its streams; the "
          "gpu0.energy rows are wattlab's counter over the window, edges placed by its "
          "samples, with the interval it states)")
    write_json("nvml_compare", {"benchmark": "nvml_compare", "counter_j": counter_j,
                                "rows": rows, "cpu_s": cpu, "phase_s": args.phase_s})
    out = os.environ.get("OUT")
    if out:
        for f in (*paths.values(), smi_path, loop_path, steps_path,
                  *folder.glob("zeus.*.txt")):
            Path(out, f.name).write_bytes(f.read_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
