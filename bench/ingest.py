"""Ingest benchmark: publisher processes -> bus -> recorder process -> HDF5, with zero loss.

In the same run it measures the floor: the same data appended straight into h5py by one
process in large chunks, with the same datasets (time, time_raw, values, flags) — with
ordinary ``ds[a:b] = x`` appends (the floor the goal is set against) and, for an honest
comparison, with whole-chunk ``write_direct_chunk`` writes (what the recorder does).

    python bench/ingest.py            # full: ~100 M values
    python bench/ingest.py --quick    # CI-sized: seconds

Prints a table and writes bench/results/ingest.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial

import h5py
import numpy as np

from common import GOALS_MISSED, write_json
from wattlab.runfile.writer import _ChunkColumn, _growable
from wattlab.samples import Channel, SampleBatch, SourceDescriptor
from wattlab.sync.bus import BusPublisher, ControlClient
from wattlab.sync.bus.publisher import local_endpoint
from wattlab.sync.recorder import RecorderConfig

CHANNELS = 8


def descriptor(i: int) -> SourceDescriptor:
    channels = tuple(Channel(f"ch{c}_w", "W") for c in range(CHANNELS))
    return SourceDescriptor(f"src{i}", "bench", "synthetic", channels, value_dtype="<f4")


def block(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    values = rng.normal(100, 5, size=(rows, CHANNELS)).astype("<f4")
    return np.arange(rows, dtype=np.int64) * 50_000, values


def publisher(endpoint: str, index: int, messages: int, rows: int, go: mp.Event) -> None:  # type: ignore[valid-type]
    pub = BusPublisher(endpoint, linger_ms=-1, coalesce_rows=65536)
    pub.announce(descriptor(index))
    pub.wait_ready(30)
    t_base, values = block(rows)
    go.wait()  # type: ignore[attr-defined]
    span = rows * 50_000
    for seq in range(messages):
        pub.send_batch(SampleBatch(f"src{index}", seq, t_base + seq * span, values))
    pub.end(f"src{index}", messages - 1)
    pub.close()


def run_pipeline(folder: str, sources: int, messages: int, rows: int) -> dict[str, float]:
    path = os.path.join(folder, "bus.h5")
    endpoint = local_endpoint()
    config = RecorderConfig(endpoint=endpoint, output=path, session_start_ns=0,
                            expected_sources=[f"src{i}" for i in range(sources)])
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    recorder = subprocess.Popen([sys.executable, "-m", "wattlab.sync.recorder", config.to_json()])
    ctx = mp.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=publisher, args=(endpoint, i, messages, rows, go))
             for i in range(sources)]
    for p in procs:
        p.start()
    control = ControlClient(endpoint)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = control.request("status", timeout_s=5)
        if len(status["sources"]) == sources:
            break
        time.sleep(0.05)
    time.sleep(0.2)  # let every publisher reach go.wait() after its ack
    t0 = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
    final = control.request("stop", timeout_s=600)
    elapsed = time.perf_counter() - t0
    control.close()
    _, _, rec_usage = os.wait4(recorder.pid, 0)
    recorder.returncode = 0
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    recorder_cpu_s = rec_usage.ru_utime + rec_usage.ru_stime
    total_rows = sum(s["rows"] for s in final["sources"].values())
    lost = sum(s["gaps"] for s in final["sources"].values())
    with h5py.File(path, "r") as f:
        file_rows = sum(f["sources"][f"src{i}"]["values"].shape[0] for i in range(sources))
        file_gaps = f["gaps"].shape[0]
    expected_rows = sources * messages * rows
    return {
        "seconds": elapsed,
        "values": expected_rows * CHANNELS,
        "values_per_s": expected_rows * CHANNELS / elapsed,
        "cpu_s": cpu_s,
        "cpu_s_per_million_values": cpu_s / (expected_rows * CHANNELS / 1e6),
        "recorder_cpu_s": recorder_cpu_s,  # includes its start-up, before t0
        "publishers_cpu_s": cpu_s - recorder_cpu_s,
        "rows_expected": expected_rows,
        "rows_in_file": file_rows,
        "rows_reported": total_rows,
        "gaps": file_gaps + lost,
        "file_mb": os.path.getsize(path) / 1e6,
    }


def _append(ds: h5py.Dataset, data: np.ndarray) -> None:
    n0 = ds.shape[0]
    ds.resize(n0 + data.shape[0], axis=0)
    ds[n0:] = data


def run_floor(folder: str, sources: int, messages: int, rows: int,
              direct: bool = False) -> dict[str, float]:
    """Same data, same datasets, one process, large appends: what h5py alone can do.

    ``direct``: whole chunks through ``write_direct_chunk`` (the recorder's own writer
    column) instead of hyperslab appends.
    """
    path = os.path.join(folder, "floor.h5")
    t_base, values = block(rows)
    chunk_msgs = max(1, 65536 // rows)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    with h5py.File(path, "x", libver="latest") as f:
        groups = []
        for i in range(sources):
            g = f.create_group(f"src{i}")
            made = (_growable(g, "time", "<i8"), _growable(g, "time_raw", "<i8"),
                    _growable(g, "values", "<f4", CHANNELS), _growable(g, "flags", "u1"))
            groups.append([_ChunkColumn(d).append if direct else partial(_append, d)
                           for d in made])
        span = rows * 50_000
        for start in range(0, messages, chunk_msgs):
            count = min(chunk_msgs, messages - start)
            t = np.concatenate([t_base + (start + k) * span for k in range(count)])
            v = np.concatenate([values] * count)
            flags = np.zeros(t.shape[0], dtype=np.uint8)
            for appenders in groups:
                for append, data in zip(appenders, (t, t, v, flags), strict=True):
                    append(data)
        if direct:
            for appenders in groups:
                for append in appenders:
                    append.__self__.flush()  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - t0
    cpu_s = time.process_time() - cpu0
    total = sources * messages * rows * CHANNELS
    return {"seconds": elapsed, "values": total, "values_per_s": total / elapsed,
            "cpu_s": cpu_s, "cpu_s_per_million_values": cpu_s / (total / 1e6)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run for CI")
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--rows", type=int, default=1000, help="samples per message")
    parser.add_argument("--messages", type=int, help="messages per source")
    parser.add_argument("--repeat", type=int, help="runs of each path; the median is reported")
    args = parser.parse_args()
    messages = args.messages or (50 if args.quick else 1000)
    repeat = args.repeat or (1 if args.quick else 3)
    floors, directs, buses = [], [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="wattlab-ingest-") as folder:
            floors.append(run_floor(folder, args.sources, messages, args.rows))
        with tempfile.TemporaryDirectory(prefix="wattlab-ingest-") as folder:
            directs.append(run_floor(folder, args.sources, messages, args.rows, direct=True))
        with tempfile.TemporaryDirectory(prefix="wattlab-ingest-") as folder:
            buses.append(run_pipeline(folder, args.sources, messages, args.rows))
    floor, direct, bus = (sorted(runs, key=lambda r: r["values_per_s"])[len(runs) // 2]
                          for runs in (floors, directs, buses))
    ratio = bus["values_per_s"] / floor["values_per_s"]
    print(f"ingest: {args.sources} sources x {messages} messages x {args.rows} rows x "
          f"{CHANNELS} float32 channels (+ int64 time)")
    print(f"{'path':<26} {'seconds':>8} {'M values/s':>11} {'CPU s/M values':>15} "
          f"{'all runs (M values/s)':>24}")
    for name, r, runs in (("h5py floor (1 proc)", floor, floors),
                          ("floor, direct chunks", direct, directs),
                          ("bus + recorder", bus, buses)):
        spread = " / ".join(f"{x['values_per_s'] / 1e6:.0f}" for x in runs)
        print(f"{name:<26} {r['seconds']:>8.2f} {r['values_per_s'] / 1e6:>11.1f} "
              f"{r['cpu_s_per_million_values']:>15.4f} {spread:>24}")
    print(f"median of {repeat}; ratio bus/floor: {ratio:.2f} (bus/direct-chunk floor: "
          f"{bus['values_per_s'] / direct['values_per_s']:.2f}); CPU s: recorder "
          f"{bus['recorder_cpu_s']:.2f}, publishers {bus['publishers_cpu_s']:.2f}; rows in file "
          f"{bus['rows_in_file']} of {bus['rows_expected']}; gaps {bus['gaps']}")
    write_json("ingest", {
        "benchmark": "ingest", "quick": args.quick, "sources": args.sources,
        "messages_per_source": messages, "rows_per_message": args.rows, "channels": CHANNELS,
        "repeat": repeat, "floor": floor, "floor_direct": direct, "bus": bus, "ratio": ratio,
        "all_floor": floors, "all_floor_direct": directs, "all_bus": buses,
    })
    lossless = all(b["rows_in_file"] == b["rows_expected"] and b["gaps"] == 0 for b in buses)
    return 0 if lossless else GOALS_MISSED


if __name__ == "__main__":
    sys.exit(main())
