"""Every GPU of a several-GPU host at once: `wattlab record --nvml all` beside the peers.

    python bench/multi_gpu.py [--period-s 4 --cycles 5]   # needs >= 2 NVIDIA GPUs; read-only

Part 1, one run: each GPU runs its own square wave (tests/with_device/square_per_gpu.py),
out of phase with the others, reading its own energy counter at every edge (the reference).
At the same time `wattlab record --nvml all`, `nvidia-smi --query-gpu=timestamp,index,
power.draw -lms 100` and a 100 ms pynvml loop over all GPUs read them. Per GPU: distinct
driver readings/s and duplicates of wattlab's 50 Hz samples, energy against that GPU's
counter, the delay until each reader shows the GPU's first idle -> full edge; per reader:
steady CPU of its process tree (CPU clocks, from 10 s after start to the end), per GPU.

Part 2: two `wattlab agent`s on this host (``--nvml 0`` and ``--nvml 1``) into one
recorder, under the same kind of load: both agents share this host's clock, so the offset
the recorder estimates for each should be 0; and each agent's GPU shows its load edges with
the same delay as a local reader (one timebase).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import tree_cpu_s, write_json
from compact_run import compact
from nvml_compare import (
    counter_window,
    distinct_per_s,
    finish,
    read_loop,
    read_smi,
    read_wattlab,
    start,
    step_delay_ms,
    window_energy,
)

HERE = Path(__file__).resolve().parent
LOAD = HERE.parent / "tests" / "with_device" / "square_per_gpu.py"
WATTLAB = [sys.executable, "-m", "wattlab.cli"]
STEADY_FROM_S = 10.0


def gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:
        print(f"multi_gpu: no NVIDIA GPU here ({e})")
        return 0


def run_loads(folder: Path, tag: str, n: int, period_s: float, cycles: int,
              lead_s: float) -> list[list[tuple[int, int, int]]]:
    """One square-wave process per GPU, all phased from one start; their edges per GPU."""
    begin = time.time() + lead_s
    loads = [start([sys.executable, str(LOAD), "--gpu", str(g), "--gpus", str(n),
                    "--period-s", str(period_s), "--cycles", str(cycles),
                    "--start-unix-s", f"{begin:.3f}", "--edges", str(folder / f"{tag}{g}.txt")])
             for g in range(n)]
    for proc in loads:
        if proc.wait() != 0:
            raise SystemExit(f"multi_gpu: the load on a GPU failed ({proc.args})")
    return [[tuple(int(v) for v in line.split())  # type: ignore[misc]
             for line in (folder / f"{tag}{g}.txt").read_text().splitlines()]
            for g in range(n)]


def samples_quality(path: Path, source: str) -> tuple[float, int]:
    """Distinct driver readings per second (by stamp) and duplicated stamps of a stream."""
    import wattlab

    with wattlab.open(str(path)) as run:
        t = run.source(source).time_ns
    return distinct_per_s(t, t, by_time=True), int(t.size - np.unique(t).size)


def part_one(folder: Path, n: int, period_s: float, cycles: int) -> dict[str, object]:
    run_path, smi_path, loop_path = folder / "all.h5", folder / "smi.csv", folder / "loop.txt"
    gpus = ",".join(str(g) for g in range(n))
    with open(smi_path, "w") as smi_out:
        readers = {
            "wattlab --nvml all": start([*WATTLAB, "record", "--nvml", "all", "--duration",
                                         "3600", "-o", str(run_path)], stdout=subprocess.DEVNULL),
            "nvidia-smi -lms 100": start(["nvidia-smi", "--query-gpu=timestamp,index,power.draw",
                                          "--format=csv", "-lms", "100"], stdout=smi_out),
            "pynvml loop 100 ms": start([sys.executable, str(HERE / "nvml_poll_loop.py"),
                                         str(loop_path), "0.1", gpus]),
        }
        time.sleep(STEADY_FROM_S)
        steady_from = {name: (time.monotonic(), tree_cpu_s(p.pid)) for name, p in readers.items()}
        edges = run_loads(folder, "edges", n, period_s, cycles, lead_s=3.0)
        time.sleep(2.0)
        steady = {name: 100 * (tree_cpu_s(p.pid) - steady_from[name][1])
                  / (time.monotonic() - steady_from[name][0]) for name, p in readers.items()}
        for proc in readers.values():
            finish(proc, stop=True)
    rows = []
    for g in range(n):
        a, b = edges[g][0][0], edges[g][-1][0]
        counter_j = (edges[g][-1][2] - edges[g][0][2]) / 1e3
        series = {
            "wattlab samples": read_wattlab(run_path, [(f"gpu{g}.samples", "power_w")])[
                f"gpu{g}.samples:power_w"],
            "nvidia-smi -lms 100": read_smi(smi_path, gpu=g),
            "pynvml loop 100 ms": read_loop(Path(f"{loop_path}.{g}")),
        }
        distinct, duplicates = samples_quality(run_path, f"gpu{g}.samples")
        for reader, (t, p) in series.items():
            energy = window_energy(t, p, a, b)
            rows.append({"gpu": g, "reader": reader,
                         "distinct_per_s": distinct if reader == "wattlab samples"
                         else distinct_per_s(t, p),
                         "duplicates": duplicates if reader == "wattlab samples" else None,
                         "energy_error_pct": 100 * (energy - counter_j) / counter_j,
                         "step_delay_ms": step_delay_ms(t, p, edges[g][0][0], edges[g][1][0])})
        energy, plus_minus = counter_window(run_path, a, b, source=f"gpu{g}.energy")
        rows.append({"gpu": g, "reader": "wattlab energy --window", "distinct_per_s": None,
                     "duplicates": None,
                     "energy_error_pct": 100 * (energy - counter_j) / counter_j,
                     "energy_uncertainty_pct": 100 * plus_minus / energy,
                     "step_delay_ms": None})
    cpu = {name: {"steady_cpu_pct": pct, "per_gpu_pct": pct / n} for name, pct in steady.items()}
    return {"rows": rows, "cpu": cpu}


def part_two(folder: Path, period_s: float, cycles: int) -> dict[str, dict[str, float]]:
    keys, allowed = folder / "keys", folder / "allowed"
    allowed.mkdir()
    subprocess.run([*WATTLAB, "keys", "recorder", "a0", "a1", "-d", str(keys)], check=True,
                   stdout=subprocess.DEVNULL)
    for name in ("a0", "a1"):
        (allowed / f"{name}.key").write_bytes((keys / f"{name}.key").read_bytes())
    run_path, endpoint = folder / "agents.h5", "tcp://127.0.0.1:5571"
    record = start([*WATTLAB, "record", "--listen", endpoint, "--server-key",
                    str(keys / "recorder.key_secret"), "--allow-keys", str(allowed),
                    "--agent", "a0", "--agent", "a1", "--nvml", "none", "--duration", "3600",
                    "-o", str(run_path)], stdout=subprocess.DEVNULL)
    agents = [start([*WATTLAB, "agent", "--connect", endpoint, "--key",
                     str(keys / f"a{g}.key_secret"), "--server-key", str(keys / "recorder.key"),
                     "--nvml", str(g)], stdout=subprocess.DEVNULL) for g in (0, 1)]
    time.sleep(8.0)
    edges = run_loads(folder, "agent-edges", 2, period_s, cycles, lead_s=3.0)
    time.sleep(2.0)
    finish(record, stop=True)
    for proc in agents:
        proc.wait(timeout=30)
    import h5py

    out: dict[str, dict[str, float]] = {}
    with h5py.File(run_path, "r") as run:
        for g in (0, 1):
            attrs = dict(run[f"sync/a{g}"].attrs)
            out[f"a{g}"] = {k: float(attrs[k]) for k in
                            ("offset_ns", "drift_ppm", "rtt_median_ns", "residual_rms_ns")
                            if k in attrs}
    for g in (0, 1):
        t, p = read_wattlab(run_path, [(f"a{g}.gpu{g}.samples", "power_w")])[
            f"a{g}.gpu{g}.samples:power_w"]
        out[f"a{g}"]["step_delay_ms"] = step_delay_ms(t, p, edges[g][0][0], edges[g][1][0])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--period-s", type=float, default=4.0)
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    n = gpu_count()
    if n < 2:
        print(f"multi_gpu: skipped, {n} GPU(s) here (needs 2 or more)")
        return 0
    folder = Path(tempfile.mkdtemp(prefix="wattlab-multi-"))
    one = part_one(folder, n, args.period_s, args.cycles)
    two = part_two(folder, args.period_s, args.cycles)
    print(f"{n} GPUs, each a {args.period_s} s square wave out of phase, {args.cycles} cycles")
    print(f"{'GPU':>3} {'reader':<26} {'distinct/s':>10} {'dupl.':>6} {'energy err %':>12} "
          f"{'step delay ms':>13}")
    for r in one["rows"]:  # type: ignore[attr-defined]
        print(f"{r['gpu']:>3} {r['reader']:<26} {r['distinct_per_s'] or math.nan:>10.2f} "
              f"{'' if r['duplicates'] is None else r['duplicates']:>6} "
              f"{r['energy_error_pct']:>12.3f} {r['step_delay_ms'] or math.nan:>13.0f}"
              + (f"  (± {r['energy_uncertainty_pct']:.2f} % stated)"
                 if "energy_uncertainty_pct" in r else ""))
    print(f"{'reader':<26} {'steady CPU % of a core':>22} {'per GPU':>8}")
    for name, c in one["cpu"].items():  # type: ignore[attr-defined]
        print(f"{name:<26} {c['steady_cpu_pct']:>22.3f} {c['per_gpu_pct']:>8.3f}")
    print("two agents on this host (--nvml 0, --nvml 1) into one recorder:")
    for name, a in two.items():
        print(f"  {name}: offset {a.get('offset_ns', math.nan) / 1e3:.1f} us, drift "
              f"{a.get('drift_ppm', math.nan):.2f} ppm, residual rms "
              f"{a.get('residual_rms_ns', math.nan) / 1e3:.1f} us, step delay "
              f"{a['step_delay_ms']:.0f} ms")
    write_json("multi_gpu", {"benchmark": "multi_gpu", "gpus": n, "period_s": args.period_s,
                             "cycles": args.cycles, **one, "agents": two})
    out = os.environ.get("OUT")
    if out:  # the run files, compacted to fit what comes back from the GPU machine
        for f in (folder / "all.h5", folder / "agents.h5"):
            compact(str(f), str(Path(out, f.name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
