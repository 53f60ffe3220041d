"""What `--prometheus` costs a recording, scraped every 15 s.

    python bench/prometheus_cost.py                 # 4 pairs of 120 s recordings (~9 min)
    python bench/prometheus_cost.py --quick         # 1 pair of 20 s (CI-sized)
    python bench/prometheus_cost.py --duration 60 --pairs 2

Two measurements. (1) Whole recordings (`wattlab record --simulate`, every NVML stream),
in pairs: one with `--prometheus` (scraped over HTTP every 15 s by this script) and one
without, run at the same time so that the machine's other load falls on both alike, the
order of their start alternating from pair to pair. Each one's steady CPU is read from
its process tree's CPU clocks (``common.tree_cpu_s``, to the nanosecond) from
``STEADY_FROM_S`` after its start (start-up, the import of prometheus-client included,
stays out) until shortly before its end; the exporter's cost is the difference within a
pair, as % of one core, reported as the median and the spread over the pairs. (2) The
exporter's two costs timed directly: feeding one flush's rows (`StreamMetrics.add_rows`,
per stream, twice a second) and answering one scrape, added up per second.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from common import median, tree_cpu_s, write_json
from wattlab.samples import Channel, SourceDescriptor
from wattlab.sync.recorder import Exporter, StreamMetrics

SCRAPE_S = 15.0
FLUSHES_PER_S = 2.0  # the recorder's 0.5 s flush
STEADY_FROM_S = 10.0  # after a recording's start: imports and set-up are done
STEADY_UNTIL_S = 3.0  # before its planned end: the closing summary stays out


def pair(duration_s: float, folder: Path, i: int) -> dict[str, float]:
    """Steady CPU (% of a core) of a recording with and one without the exporter, at once."""
    port = free_port()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    order = ["with", "without"] if i % 2 == 0 else ["without", "with"]
    for name in order:
        argv = [sys.executable, "-m", "wattlab.cli", "record", "--simulate", "--duration",
                str(duration_s), "-o", str(folder / f"r{i}-{name}.h5"), "--no-live"]
        if name == "with":
            argv += ["--prometheus", str(port)]
        procs[name] = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
    started = time.monotonic()
    marks: dict[str, list[tuple[float, float]]] = {name: [] for name in procs}
    next_scrape = started + 2.0
    for at_s in (STEADY_FROM_S, duration_s - STEADY_UNTIL_S):
        while time.monotonic() < started + at_s:
            if time.monotonic() >= next_scrape:
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                next_scrape += SCRAPE_S
            time.sleep(0.05)
        for name, proc in procs.items():
            marks[name].append((time.monotonic(), tree_cpu_s(proc.pid)))
    for proc in procs.values():
        if proc.wait() != 0:
            raise SystemExit(f"a recording failed: {proc.args}")
    return {name: 100 * (m[1][1] - m[0][1]) / (m[1][0] - m[0][0]) for name, m in marks.items()}


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
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="one pair of 20 s recordings")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.pairs = 20.0, 1
    if args.duration < STEADY_FROM_S + STEADY_UNTIL_S + 5:
        raise SystemExit(f"--duration must leave a steady window: at least "
                         f"{STEADY_FROM_S + STEADY_UNTIL_S + 5:g} s")
    cost = micro()
    with tempfile.TemporaryDirectory() as tmp:
        pairs = [pair(args.duration, Path(tmp), i) for i in range(args.pairs)]
    diffs = [p["with"] - p["without"] for p in pairs]
    print(f"exporter, timed directly: feed {cost['feed_s'] * 1e6:.1f} us per flush "
          f"(4 power streams), scrape {cost['scrape_s'] * 1e3:.2f} ms (client included)")
    print(f"  -> {cost['core_pct']:.4f} % of a core at {FLUSHES_PER_S:g} flushes/s and one "
          f"scrape per {SCRAPE_S:g} s (goal 0.05 %)")
    print(f"whole recordings, {args.pairs} pair(s) of {args.duration:g} s run side by side, "
          f"steady CPU from {STEADY_FROM_S:g} s to {STEADY_UNTIL_S:g} s before the end "
          f"(% of a core):")
    for i, p in enumerate(pairs):
        print(f"  pair {i}: without {p['without']:.3f}, with --prometheus {p['with']:.3f}, "
              f"difference {p['with'] - p['without']:+.3f}")
    print(f"  difference: median {median(diffs):+.3f}, spread {min(diffs):+.3f} .. "
          f"{max(diffs):+.3f} (goal <= 0.05)")
    write_json("prometheus_cost", {**cost, "quick": args.quick, "duration_s": args.duration,
                                   "pairs": pairs, "diff_core_pct": diffs,
                                   "diff_median_core_pct": median(diffs)})


if __name__ == "__main__":
    main()
