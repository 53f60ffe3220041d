"""Analysis at scale: `wattlab energy` and `wattlab calibrate` on a 1-hour 20 kHz recording.

    python bench/analysis_scale.py            # 1 hour x 20 kHz x 8 channels (576 M values)
    python bench/analysis_scale.py --quick    # 60 s, for CI
    python bench/analysis_scale.py --keep /tmp/hour.h5   # make the file once, reuse it after

The file is made with the real recorder (publisher processes -> bus -> recorder): a riser
stream `ps3` (8 float32 channels at 20 kHz) and an NVML-like `gpu0.power` stream (50 Hz,
a 1 s average lagging 0.5 s). Each command then runs as its own process; wall time and
peak memory (max RSS) are compared with the floor: one process reading every dataset of
the file once, in chunks, with h5py. The three run in turn ``--repeat`` times (so load
from other processes falls on all of them alike) and the median of each is reported.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from common import median, write_json
from wattlab.samples import Channel, SampleBatch, SourceDescriptor
from wattlab.sync.bus import BusPublisher, ControlClient
from wattlab.sync.bus.publisher import local_endpoint
from wattlab.sync.recorder import RecorderConfig

RATE_HZ = 20_000
ROWS = 1000
PATTERN_S = 10
CHANNELS = ("current0_a", "voltage0_v", "power0_w", "current1_a", "voltage1_v", "power1_w",
            "power2_w", "power_total_w")


def true_power_w(t_s: np.ndarray) -> np.ndarray:
    """Phases of 1-3 s between 90 and 600 W with a 37 Hz ripple, repeating every 10 s."""
    level = np.array([90, 600, 350, 600, 120, 480, 90, 600, 250, 400], dtype=np.float64)
    return level[(t_s % PATTERN_S).astype(int)] + 8 * np.sin(2 * np.pi * 37 * t_s)


def riser_pattern() -> np.ndarray:
    t = np.arange(PATTERN_S * RATE_HZ) / RATE_HZ
    total = true_power_w(t)
    slot, cable = 0.2 * total, 0.75 * total
    small = total - slot - cable
    cols = [slot / 12, np.full_like(t, 12.0), slot, cable / 12, np.full_like(t, 12.0), cable,
            small, total]
    return np.stack(cols, axis=1).astype("<f4")


def publish_riser(endpoint: str, seconds: float) -> None:
    pattern = riser_pattern()
    channels = tuple(Channel(c, c.rsplit("_", 1)[1].upper()) for c in CHANNELS)
    pub = BusPublisher(endpoint, linger_ms=-1, coalesce_rows=65536)
    pub.announce(SourceDescriptor("ps3", "powersensor3", "synthetic", channels,
                                  value_dtype="<f4"))
    step_ns = 1_000_000_000 // RATE_HZ
    base = np.arange(ROWS, dtype=np.int64) * step_ns
    per_pattern = len(pattern) // ROWS
    for seq in range(int(seconds * RATE_HZ) // ROWS):
        k = seq % per_pattern
        pub.send_batch(SampleBatch("ps3", seq, base + seq * ROWS * step_ns,
                                   pattern[k * ROWS:(k + 1) * ROWS]))
    pub.end("ps3", seq)
    pub.close()


def publish_nvml(endpoint: str, seconds: float) -> None:
    t_s = np.arange(int(seconds * 50)) / 50
    fine = np.arange(int(seconds * 1000) + 1000) / 1000 - 1.5
    cumulative = np.concatenate(([0.0], np.cumsum(true_power_w(np.maximum(fine, 0)) / 1000)))
    lagged = t_s - 0.5

    def energy_at(x: np.ndarray) -> np.ndarray:
        return np.interp(x, fine, cumulative[1:])

    average = energy_at(lagged) - energy_at(lagged - 1.0)
    pub = BusPublisher(endpoint, linger_ms=-1, coalesce_rows=65536)
    pub.announce(SourceDescriptor(
        "gpu0.power", "nvml", "Synthetic GPU", (Channel("average_power_w", "W"),),
        config={"power_channel": "average_power_w", "driver_version": "0"}))
    t_ns = (t_s * 1e9).astype(np.int64)
    chunk = 500
    seq = 0
    for seq, start in enumerate(range(0, len(t_ns), chunk)):
        pub.send_batch(SampleBatch("gpu0.power", seq, t_ns[start:start + chunk],
                                   average[start:start + chunk, None]))
    pub.end("gpu0.power", seq)
    pub.close()


def make_file(path: str, seconds: float) -> float:
    endpoint = local_endpoint()
    config = RecorderConfig(endpoint=endpoint, output=path, session_start_ns=0,
                            expected_sources=["ps3", "gpu0.power"])
    t0 = time.perf_counter()
    recorder = subprocess.Popen([sys.executable, "-m", "wattlab.sync.recorder",
                                 config.to_json()])
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=f, args=(endpoint, seconds)) for f in (publish_riser,
                                                                        publish_nvml)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    control = ControlClient(endpoint)
    control.request("stop", timeout_s=3600)
    control.close()
    recorder.wait()
    return time.perf_counter() - t0


FLOOR = """
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    for group in f["sources"].values():
        for name in ("time", "time_raw", "values", "flags"):
            ds = group[name]
            for start in range(0, ds.shape[0], 1 << 20):
                ds[start:start + (1 << 20)]
"""


def timed(cmd: list[str]) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed with status {proc.returncode}")
    return {"seconds": time.perf_counter() - t0, "peak_rss_mb": usage.ru_maxrss / 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime}


@contextmanager
def hour_file(keep: str | None, seconds: float) -> Iterator[tuple[str, float | None]]:
    """(path, seconds taken to make it): a temporary file, or ``keep``, made if missing.

    Why ``keep``: making the hour file takes ~30 s of both cores, and iterating on the
    analysis only needs it once (None: the kept file was already there).
    """
    if keep is not None:
        made = None if os.path.exists(keep) else make_file(keep, seconds)
        yield keep, made
        return
    with tempfile.TemporaryDirectory(prefix="wattlab-scale-") as folder:
        path = str(Path(folder) / "hour.h5")
        yield path, make_file(path, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="60 s of data instead of 1 hour")
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command (median)")
    parser.add_argument("--keep", metavar="PATH",
                        help="use this file, recording it first if it does not exist (it is "
                             "kept; an existing one is used as is, whatever --seconds says)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    seconds = args.seconds or (60.0 if args.quick else 3600.0)
    wattlab = [sys.executable, "-m", "wattlab.cli"]
    with hour_file(args.keep, seconds) as (path, make_s):
        size_gb = os.path.getsize(path) / 1e9
        commands = {
            "h5py: read every dataset once (floor)": [sys.executable, "-c", FLOOR, path],
            "wattlab energy": [*wattlab, "energy", path, "--json"],
            "wattlab calibrate": [*wattlab, "calibrate", path, "--reference",
                                  "ps3:power_total_w", "--target",
                                  "gpu0.power:average_power_w", "--no-store"],
        }
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
        for _ in range(args.repeat):
            for name, cmd in commands.items():
                runs[name].append(timed(cmd))
    rows: dict[str, dict[str, Any]] = {
        name: {"seconds": median([r["seconds"] for r in rs]),
               "runs_s": [r["seconds"] for r in rs],
               "cpu_s": median([r["cpu_s"] for r in rs]),
               "peak_rss_mb": max(r["peak_rss_mb"] for r in rs)} for name, rs in runs.items()}
    floor_s = rows["h5py: read every dataset once (floor)"]["seconds"]
    values = int(seconds * RATE_HZ) * len(CHANNELS)
    made = "kept from before" if make_s is None else f"made by the recorder in {make_s:.1f} s"
    print(f"analysis at scale: {seconds:g} s x 20 kHz x 8 channels = {values / 1e6:.0f} M "
          f"values, file {size_gb:.2f} GB, {made}")
    print(f"{'command':<40} {'median s':>8} {'runs s':>18} {'x floor':>8} {'CPU s':>6} "
          f"{'peak RSS MB':>12}")
    for name, r in rows.items():
        spread = f"{min(r['runs_s']):.2f}-{max(r['runs_s']):.2f}"
        print(f"{name:<40} {r['seconds']:>8.2f} {spread:>18} {r['seconds'] / floor_s:>8.2f} "
              f"{r['cpu_s']:>6.2f} {r['peak_rss_mb']:>12.0f}")
    write_json("analysis_scale", {"benchmark": "analysis_scale", "quick": args.quick,
                                  "seconds_of_data": seconds,
                                  "values": values, "file_gb": size_gb, "make_s": make_s,
                                  "repeat": args.repeat, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
