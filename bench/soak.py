"""Soak: a long recording of the whole virtual bench, every source in its own process.

    python bench/soak.py                 # 10 minutes
    python bench/soak.py --quick         # 15 s: what CI runs (bench/run_all --quick)
    python bench/soak.py --seconds 60 --keep run.h5

The emulated PowerSensor3 (20 kHz, pty) and the emulated WT310E (TCP, pyvisa-py), both
measuring the virtual bench's simulated GPU, and simulated NVML are recorded by
``wattlab record --source-processes`` (a subprocess, so its memory is its own). Goals:
zero lost samples (PowerSensor3 frames written by the emulator = rows in the file; no gaps
anywhere), memory flat (RSS of the session, the recorder and every source process after
a warm-up and at the end, bounded by --max-rss-growth-mb), and the CPU each process
used. The emulators' own counters say whether *they* kept up (frames skipped after a
stall of their thread, bytes the pty could not hold); the file is checked for time
running backwards and for holes in the PowerSensor3 stream. Prints a table and writes
bench/results/soak.json; exit status 3 (``GOALS_MISSED``) when a goal is missed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import GOALS_MISSED, process_cpu_clock, write_json
from wattlab.hardware.emulators.powersensor3_emulator import PowerSensor3Emulator
from wattlab.hardware.emulators.wt300e_emulator import Wt300eEmulator
from wattlab.hardware.virtual_bench import VirtualBench
from wattlab.runfile import Run

ROLES = {"session", "recorder", "source gpu0", "source ps3", "source wall"}


def proc_stats(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds) of one process."""
    cpu_s = time.clock_gettime(process_cpu_clock(pid))
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
        elif "wattlab.acquisition.session.source_child" in cmd:
            name = cmd.split('"name": "', 1)[1].split('"', 1)[0] if '"name": "' in cmd else "?"
            roles[f"source {name}"] = int(entry.name)
    return roles


def check_file(path: str) -> dict[str, Any]:
    """What the run file itself says: rows, /gaps, time order, holes in the 20 kHz stream."""
    with Run(path) as run:
        rows = {sid: len(view) for sid, view in run.sources.items()}
        gaps = [g.__dict__ for g in run.gaps]
        backwards = {}
        for sid in run.sources:
            steps = np.diff(run.source(sid).time_ns)
            if steps.size and steps.min() < 0:
                backwards[sid] = {"count": int(np.sum(steps < 0)),
                                  "worst_ms": float(-steps.min()) / 1e6}
        ps3_steps = np.diff(run.source("ps3").time_ns) if "ps3" in run.sources else np.zeros(0)
    holes = ps3_steps[ps3_steps > 1_000_000]  # 20 frames of 50 µs missing between two rows
    return {"rows": rows, "gaps": gaps, "time_backwards": backwards,
            "ps3_holes_over_1ms": int(holes.size),
            "ps3_hole_time_s": float(np.sum(holes)) / 1e9}


def soak(seconds: float, folder: str, keep: str = "") -> dict[str, Any]:
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
        # the warm-up counts from when the recording runs (the file and every process are
        # there), not from the launch: a busy machine stretches the start-up, whose imports
        # were counted as growth (a recorder at 9 MB 6 s after launch, 50 MB later)
        recording_s: float | None = None
        while session.poll() is None:
            now = time.monotonic() - started
            roles = tree(session.pid)
            if recording_s is None and Path(out).exists() and set(roles) >= ROLES:
                recording_s = now
            for role, pid in roles.items():
                try:
                    rss, cpu = proc_stats(pid)
                except OSError:
                    continue
                if recording_s is not None and now >= recording_s + warmup_s \
                        and role not in first:
                    first[role] = (now, rss, cpu)
                # while recording: after it the session reads the file for its summary
                # (tens of MB for a moment), which is not what "flat" is about
                if role in first and now <= seconds:
                    last[role] = (now, rss, cpu)
                    if now >= next_sample.get(role, 0.0):  # the RSS curve, ~20 points
                        curve.setdefault(role, []).append((round(now, 1), round(rss, 1)))
                        next_sample[role] = now + seconds / 20
            time.sleep(0.5)
        stdout, stderr = session.communicate()
        emulators = {"ps3_frames_sent": ps3.frames_sent,
                     "ps3_frames_skipped_by_emulator": ps3.frames_lost,
                     "ps3_bytes_overflowed": ps3.bytes_overflowed,
                     "wall_updates": wall.updates}
    checks = check_file(out)
    if keep:
        shutil.copyfile(out, keep)
    procs = {}
    for role, (t0, rss0, cpu0) in first.items():
        t1, rss1, cpu1 = last[role]
        procs[role] = {"rss_start_mb": rss0, "rss_end_mb": rss1, "rss_growth_mb": rss1 - rss0,
                       "cpu_pct_of_core": 100 * (cpu1 - cpu0) / max(t1 - t0, 1e-9),
                       "rss_curve_s_mb": curve.get(role, [])}
    rows = checks["rows"]
    ps3_gaps = [g for g in checks["gaps"] if g["source"] == "ps3"]
    return {"seconds": seconds, "exit_status": session.returncode, **checks, **emulators,
            "ps3_rows": rows.get("ps3", 0),
            "ps3_lost": emulators["ps3_frames_sent"] - rows.get("ps3", 0),
            # what the file says was lost: frames its gap rows count (the host sees frames
            # the emulator skipped too, as a jump of the device's clock), and gap rows that
            # cannot count them (a failed source, corrupt bytes skipped)
            "ps3_lost_reported": sum(g["samples_lost"] for g in ps3_gaps
                                     if g["samples_lost"] > 0),
            "ps3_uncounted_gaps": sum(g["samples_lost"] <= 0 for g in ps3_gaps),
            "processes": procs,
            "stderr_tail": stderr.decode()[-500:], "stdout_tail": stdout.decode()[-300:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--quick", action="store_true", help="15 s (CI)")
    parser.add_argument("--keep", default="", help="copy the run file here")
    parser.add_argument("--max-rss-growth-mb", type=float, default=25.0,
                        help="per process, after the warm-up")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 15.0
    with tempfile.TemporaryDirectory(prefix="wattlab-soak-") as folder:
        result = soak(args.seconds, folder, args.keep)
    print(f"soak: {args.seconds:g} s of PowerSensor3 (20 kHz) + WT310E + simulated NVML, "
          "every source in its own process")
    print(f"{'process':<16} {'RSS start MB':>12} {'RSS end MB':>11} {'growth MB':>10} "
          f"{'CPU % core':>11}")
    for role, p in sorted(result["processes"].items()):
        print(f"{role:<16} {p['rss_start_mb']:>12.1f} {p['rss_end_mb']:>11.1f} "
              f"{p['rss_growth_mb']:>10.1f} {p['cpu_pct_of_core']:>11.1f}")
    print(f"PowerSensor3 frames sent {result['ps3_frames_sent']}, rows in file "
          f"{result['ps3_rows']}, lost {result['ps3_lost']}; frames the emulator skipped "
          f"(its thread stalled > 50 ms) {result['ps3_frames_skipped_by_emulator']}, "
          f"pty overflow {result['ps3_bytes_overflowed']} bytes; holes > 1 ms in the stream "
          f"{result['ps3_holes_over_1ms']} ({result['ps3_hole_time_s']:.2f} s)")
    print(f"WT310E updates {result['wall_updates']}, rows {result['rows'].get('wall', 0)}; "
          f"rows per stream {result['rows']}")
    print(f"gaps in the file: {len(result['gaps'])} "
          f"({sum(g['samples_lost'] for g in result['gaps'])} samples, "
          f"{sorted({(g['source'], g['reason']) for g in result['gaps']})}); time backwards: "
          f"{result['time_backwards'] or 'none'}; session exit status {result['exit_status']}")
    write_json("soak", {"benchmark": "soak", "quick": args.quick, **result})
    growth = max((p["rss_growth_mb"] for p in result["processes"].values()), default=0.0)
    missed = [what for what, bad in [
        ("PowerSensor3 frames lost", result["ps3_lost"] != 0),
        ("gaps in the file", bool(result["gaps"])),
        ("time going backwards", bool(result["time_backwards"])),
        ("session exit status", result["exit_status"] != 0),
        (f"RSS growth {growth:.1f} MB", growth > args.max_rss_growth_mb)] if bad]
    if missed:
        print(f"goals missed: {', '.join(missed)}")
    return GOALS_MISSED if missed else 0


if __name__ == "__main__":
    sys.exit(main())
