"""Soak: a long recording of the whole virtual bench, every source in its own process.

    python bench/soak.py                 # 10 minutes
    python bench/soak.py --seconds 30    # CI-sized

The emulated PowerSensor3 (20 kHz, pty) and the emulated WT310E (TCP, pyvisa-py), both
measuring the virtual bench's simulated GPU, and simulated NVML are recorded by
``wattlab record --source-processes`` (a subprocess, so its memory is its own). Goals:
zero lost samples (PowerSensor3 frames written by the emulator = rows in the file; no gaps
anywhere), memory flat (RSS of the session, the recorder and every source process after
a warm-up and at the end), and the CPU each process used. Prints a table and writes
bench/results/soak.json.
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

from common import write_json
from wattlab.analysis.run_file import Run
from wattlab.hardware.powersensor3_emulator import PowerSensor3Emulator
from wattlab.hardware.virtual_bench import VirtualBench
from wattlab.hardware.wt300e_emulator import Wt300eEmulator

TICKS = os.sysconf("SC_CLK_TCK")


def proc_stats(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds) of one process, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(stat[11]) + int(stat[12])) / TICKS
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024, cpu_s
    return 0.0, cpu_s


def tree(session_pid: int) -> dict[str, int]:
    """Role → pid: the session, its recorder and each source process (by stream name)."""
    roles = {"session": session_pid}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid != session_pid:
            continue
        if "wattlab.sync.recorder" in cmd:
            roles["recorder"] = int(entry.name)
        elif "wattlab.acquisition.source_process" in cmd:
            name = cmd.split('"name": "', 1)[1].split('"', 1)[0] if '"name": "' in cmd else "?"
            roles[f"source {name}"] = int(entry.name)
    return roles


def soak(seconds: float, folder: str) -> dict[str, Any]:
    out = str(Path(folder) / "soak.h5")
    bench = VirtualBench(11, seconds + 10, meters=False)  # the GPU the meters measure
    with bench, PowerSensor3Emulator(bench.gpu.true_power_w) as ps3, \
            Wt300eEmulator("WT310E", bench.gpu.true_power_w) as wall:
        argv = [sys.executable, "-m", "wattlab.cli", "record", "--source-processes",
                "--simulate", "--seed", "11", "--meter", f"ps3=powersensor3:{ps3.path}",
                "--meter", f"wall=wt310e:{wall.resource}", "--duration", str(seconds),
                "-o", out]
        session = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first: dict[str, tuple[float, float, float]] = {}
        last: dict[str, tuple[float, float, float]] = {}
        curve: dict[str, list[tuple[float, float]]] = {}
        next_sample: dict[str, float] = {}
        warmup_s = min(10.0, seconds / 5)
        started = time.monotonic()
        while session.poll() is None:
            now = time.monotonic() - started
            for role, pid in tree(session.pid).items():
                try:
                    rss, cpu = proc_stats(pid)
                except OSError:
                    continue
                if now >= warmup_s and role not in first:
                    first[role] = (now, rss, cpu)
                if role in first and now <= seconds + 2:
                    last[role] = (now, rss, cpu)
                    if now >= next_sample.get(role, 0.0):  # the RSS curve, ~20 points
                        curve.setdefault(role, []).append((round(now, 1), round(rss, 1)))
                        next_sample[role] = now + seconds / 20
            time.sleep(0.5)
        stdout, stderr = session.communicate()
        frames_sent = ps3.frames_sent
    with Run(out) as run:
        rows = {sid: len(view) for sid, view in run.sources.items()}
        gaps = [g.__dict__ for g in run.gaps]
    procs = {}
    for role, (t0, rss0, cpu0) in first.items():
        t1, rss1, cpu1 = last[role]
        procs[role] = {"rss_start_mb": rss0, "rss_end_mb": rss1, "rss_growth_mb": rss1 - rss0,
                       "cpu_pct_of_core": 100 * (cpu1 - cpu0) / max(t1 - t0, 1e-9),
                       "rss_curve_s_mb": curve.get(role, [])}
    return {"seconds": seconds, "exit_status": session.returncode, "rows": rows,
            "ps3_frames_sent": frames_sent, "ps3_rows": rows.get("ps3", 0),
            "ps3_lost": frames_sent - rows.get("ps3", 0), "gaps": gaps, "processes": procs,
            "stderr_tail": stderr.decode()[-500:], "stdout_tail": stdout.decode()[-300:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wattlab-soak-") as folder:
        result = soak(args.seconds, folder)
    print(f"soak: {args.seconds:g} s of PowerSensor3 (20 kHz) + WT310E + simulated NVML, "
          "every source in its own process")
    print(f"{'process':<16} {'RSS start MB':>12} {'RSS end MB':>11} {'growth MB':>10} "
          f"{'CPU % core':>11}")
    for role, p in sorted(result["processes"].items()):
        print(f"{role:<16} {p['rss_start_mb']:>12.1f} {p['rss_end_mb']:>11.1f} "
              f"{p['rss_growth_mb']:>10.1f} {p['cpu_pct_of_core']:>11.1f}")
    print(f"PowerSensor3 frames sent {result['ps3_frames_sent']}, rows in file "
          f"{result['ps3_rows']}, lost {result['ps3_lost']}; gaps in the file: "
          f"{len(result['gaps'])}; session exit status {result['exit_status']}")
    write_json("soak", {"benchmark": "soak", **result})
    ok = result["ps3_lost"] == 0 and not result["gaps"] and result["exit_status"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
