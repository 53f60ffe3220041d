"""A flood of samples into a recorder whose disk is too slow: bounded memory, exact loss."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import wattlab
from wattlab.sync.bus.publisher import ControlClient, local_endpoint
from wattlab.sync.recorder.process import RecorderConfig

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc"),
]

FLOOD = r"""
import json, sys, time
import numpy as np
from wattlab.samples import Channel, SampleBatch, SourceDescriptor
from wattlab.sync.bus.publisher import BusPublisher

endpoint, seconds = sys.argv[1], float(sys.argv[2])
rows = 2000
desc = SourceDescriptor("flood", "test", "Flood", tuple(Channel(f"c{i}", "W") for i in range(8)),
                        value_dtype="<f4")
pub = BusPublisher(endpoint, linger_ms=20000, window_bytes=4 << 20, backlog_bytes=4 << 20)
pub.announce(desc)
pub.wait_ready(20)
print("ready", flush=True)
seq, t0 = 0, time.monotonic()
while time.monotonic() - t0 < seconds:
    values = np.full((rows, 8), seq, dtype="<f4")
    t = time.monotonic_ns() + np.arange(rows, dtype=np.int64)
    pub.send_batch(SampleBatch("flood", seq, t, values))
    seq += 1
pub.end("flood", seq - 1)
pub.close()
print(json.dumps({"batches": seq, "rows": seq * rows, "dropped_batches": pub.dropped_batches,
                  "dropped_rows": pub.dropped_rows}), flush=True)
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_flood_into_a_slow_disk_stays_bounded_and_accounts_for_every_row(tmp_path, spawn):
    path = str(tmp_path / "flood.h5")
    endpoint = local_endpoint()
    config = RecorderConfig(endpoint=endpoint, output=path, session_start_ns=0,
                            flush_interval_s=0.2, test_write_delay_s=0.1)
    recorder = spawn([sys.executable, "-m", "wattlab.sync.recorder", config.to_json()])
    flood = spawn([sys.executable, "-c", FLOOD, endpoint, "4"], stdout=subprocess.PIPE, text=True)
    control = ControlClient(endpoint)
    try:
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "ready"
        samples: list[tuple[float, float]] = []
        while flood.poll() is None:
            try:
                samples.append((rss_mb(flood.pid), rss_mb(recorder.pid)))
            except OSError:
                break
            time.sleep(0.1)
        result = json.loads(flood.stdout.read().strip().splitlines()[-1])
        control.request("stop", timeout_s=60)
        recorder.wait(60)
    finally:
        control.close()
    assert result["dropped_batches"] > 0, "the flood must overrun this disk"
    early = samples[len(samples) // 4]
    late = max(samples[len(samples) // 4:], key=lambda s: s[0] + s[1])
    # window 4 MB + backlog 4 MB per source: growth after warm-up stays within that and noise
    assert late[0] - early[0] < 40, samples
    assert late[1] - early[1] < 40, samples
    with wattlab.open(path) as run:
        stored = len(run.source("flood"))
        gaps = run.gaps
        values = run.source("flood").channel("c0")
    lost = sum(g.samples_lost for g in gaps)
    assert all(g.samples_lost > 0 and g.seq_last >= g.seq_first >= 0 for g in gaps), gaps
    assert lost == result["dropped_rows"]
    assert stored + lost == result["rows"]  # every row: in the file or counted in /gaps
    kept = np.unique(values).astype(int)  # each batch's rows carry its sequence number
    for g in gaps:
        assert not np.isin(np.arange(g.seq_first, g.seq_last + 1), kept).any()
