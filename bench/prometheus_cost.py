"""What `--prometheus` costs a recording, scraped every 15 s.

    python bench/prometheus_cost.py                  # 2 x 60 s recordings each way
    python bench/prometheus_cost.py --duration 30 --repeat 1

Two measurements. (1) Whole recordings (`wattlab record --simulate`, every NVML stream)
with and without `--prometheus`, the exporter scraped over HTTP every 15 s: CPU seconds of
the process tree (RUSAGE_CHILDREN of this process after each ends), alternating, so other
load falls on both alike. Differences this small sit inside that noise on a shared
machine, so (2) also times the exporter's two costs directly: feeding one flush's rows
(`StreamMetrics.add_rows`, per stream, twice a second) and answering one scrape, and adds
them up per second at the recording's own flush and stream counts.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from common import median, write_json
from wattlab.samples import Channel, SourceDescriptor
from wattlab.sync.prometheus import Exporter
from wattlab.sync.stream_metrics import StreamMetrics

SCRAPE_S = 15.0
FLUSHES_PER_S = 2.0  # the recorder's 0.5 s flush


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def record(duration_s: float, prometheus: bool, folder: Path, i: int) -> float:
    """CPU seconds of one recording's whole process tree."""
    port = free_port()
    argv = [sys.executable, "-m", "wattlab.cli", "record", "--simulate", "--duration",
            str(duration_s), "-o", str(folder / f"r{i}-{prometheus}.h5"), "--no-live"]
    if prometheus:
        argv += ["--prometheus", str(port)]
    before = children_cpu_s()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    next_scrape = time.monotonic() + 2.0
    while proc.poll() is None:
        if prometheus and time.monotonic() >= next_scrape:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            next_scrape += SCRAPE_S
        time.sleep(0.1)
    return children_cpu_s() - before


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def micro(streams: int = 4, rows: int = 25, reps: int = 2000) -> dict[str, float]:
    """Seconds per flush feed (all streams) and per scrape, timed on this process's CPU."""
    metrics = StreamMetrics()
    descs = [SourceDescriptor(f"gpu0.s{i}", "nvml", "Sim", (Channel("power_w", "W"),
                                                            Channel("avg_w", "W")))
             for i in range(streams)]
    for d in descs:
        metrics.describe(d)
    t = np.arange(rows, dtype=np.int64) * 20_000_000
    v = np.random.default_rng(0).uniform(100, 500, (rows, 2))
    t0 = time.process_time()
    for k in range(reps):
        for d in descs:
            metrics.add_rows(d.source_id, t + k * rows * 20_000_000, v)
    feed_s = (time.process_time() - t0) / reps
    exporter = Exporter("127.0.0.1:0", metrics)
    try:
        t0 = time.process_time()
        for _ in range(200):
            urllib.request.urlopen(exporter.url, timeout=5).read()
        scrape_s = (time.process_time() - t0) / 200  # server and client share this process
    finally:
        exporter.close()
    return {"feed_s": feed_s, "scrape_s": scrape_s,
            "core_pct": 100 * (feed_s * FLUSHES_PER_S + scrape_s / SCRAPE_S)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    cost = micro()
    with_s: list[float] = []
    without_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            without_s.append(record(args.duration, False, Path(tmp), i))
            with_s.append(record(args.duration, True, Path(tmp), i))
    diff_pct = 100 * (median(with_s) - median(without_s)) / args.duration
    print(f"exporter, timed directly: feed {cost['feed_s'] * 1e6:.1f} us per flush "
          f"(4 power streams), scrape {cost['scrape_s'] * 1e3:.2f} ms (client included)")
    print(f"  -> {cost['core_pct']:.4f} % of a core at {FLUSHES_PER_S:g} flushes/s and one "
          f"scrape per {SCRAPE_S:g} s (goal 0.05 %)")
    print(f"whole recordings, {args.duration:g} s, median of {args.repeat}: "
          f"{median(without_s):.2f} CPU s without, {median(with_s):.2f} with --prometheus "
          f"({diff_pct:+.3f} % of a core; noise of this machine included)")
    write_json("prometheus_cost", {**cost, "duration_s": args.duration,
                                   "with_cpu_s": with_s, "without_cpu_s": without_s,
                                   "recording_diff_core_pct": diff_pct})


if __name__ == "__main__":
    main()
