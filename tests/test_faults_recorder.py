"""Recorder crashes (kill -9) and restarts, with real recorder processes, sockets and files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np
import pytest

import wattlab
from tests.conftest import Spawn
from wattlab.errors import RunFileError
from wattlab.runfile.crash_flags import clear_crash_flags, crash_flags, lookup3
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, SampleBatch, SourceDescriptor
from wattlab.sync.bus.publisher import BusPublisher, ControlClient, local_endpoint
from wattlab.sync.recorder.process import RecorderConfig

ROWS = 200  # rows per batch; a batch every ~5 ms: 40 k rows/s


def descriptor(source_id: str = "meter") -> SourceDescriptor:
    channels = (Channel("power_w", "W"), Channel("index", "1"))
    return SourceDescriptor(source_id, "test", "Fault 1", channels, value_dtype="<f8")


def batch(seq: int, source_id: str = "meter") -> SampleBatch:
    """Rows numbered across batches, so any loss or duplicate shows in the values."""
    index = np.arange(seq * ROWS, (seq + 1) * ROWS, dtype=np.float64)
    t = time.monotonic_ns() + np.arange(ROWS, dtype=np.int64) * 25_000
    return SampleBatch(source_id, seq, t, np.column_stack([index * 0.5, index]))


def start_recorder(spawn: Spawn, path: str, endpoint: str, **config: Any
                   ) -> subprocess.Popen[bytes]:
    cfg = RecorderConfig(endpoint=endpoint, output=path, session_start_ns=0,
                         root_attrs={"command": "[]"}, **{"flush_interval_s": 0.2, **config})
    return spawn([sys.executable, "-m", "wattlab.sync.recorder", cfg.to_json()],
                 stderr=subprocess.PIPE)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def rows_received(control: ControlClient, source_id: str = "meter") -> int:
    """Rows the recorder has taken in (written to disk or not)."""
    status = control.request("status", timeout_s=5)
    return int(status["sources"].get(source_id, {}).get("rows", 0))


def send_for(pub: BusPublisher, seq: int, seconds: float) -> int:
    """Send batches at ~40 k rows/s for ``seconds``; returns the next sequence number."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pub.send_batch(batch(seq))
        pub.flush()
        seq += 1
        time.sleep(0.005)
    return seq


def send_batches(pub: BusPublisher, seq: int, count: int) -> int:
    """Send ``count`` batches ~5 ms apart; returns the next sequence number."""
    for next_seq in range(seq, seq + count):
        pub.send_batch(batch(next_seq))
        pub.flush()
        time.sleep(0.005)
    return seq + count


def send_until(pub: BusPublisher, seq: int, done: Callable[[], bool], timeout_s: float) -> int:
    """Keep sending until ``done()`` (a restarted recorder may take seconds under load)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "condition not reached while sending"
        seq = send_batches(pub, seq, 1)
    return seq


def stop(control: ControlClient, recorder: subprocess.Popen[bytes]) -> dict[str, Any]:
    reply = control.request("stop", timeout_s=30)
    recorder.wait(30)
    control.close()
    if recorder.stderr is not None:
        recorder.stderr.close()
    return reply


def kill(recorder: subprocess.Popen[bytes]) -> None:
    recorder.send_signal(signal.SIGKILL)
    recorder.wait(10)
    if recorder.stderr is not None:
        recorder.stderr.close()


def index_column(path: str) -> np.ndarray:
    with wattlab.open(path) as run:
        return run.source("meter").channel("index")


@pytest.mark.system
def test_kill_9_leaves_a_readable_file_up_to_the_last_flush(tmp_path, spawn):
    path = str(tmp_path / "run.h5")
    endpoint = local_endpoint()
    recorder = start_recorder(spawn, path, endpoint)
    control = ControlClient(endpoint)
    pub = BusPublisher(endpoint, linger_ms=0, backlog_bytes=1 << 20)
    try:
        pub.announce(descriptor())
        pub.wait_ready(20)
        seq = send_for(pub, 0, 1.5)
        wait_until(lambda: rows_received(control) > 0)
        t_kill = time.monotonic_ns()
        kill(recorder)
        sent_rows = seq * ROWS
    finally:
        pub.close()
        control.close()
    assert crash_flags(path) != 0  # the writer never closed it
    index = index_column(path)
    assert len(index) > 0
    np.testing.assert_array_equal(index, np.arange(len(index)))  # whole, in order, no repeats
    with wattlab.open(path) as run:
        last_s = (t_kill - run.source("meter").time_ns[-1]) / 1e9
    assert last_s <= 1.0, f"{last_s:.2f} s lost before the kill ({len(index)}/{sent_rows} rows)"


@pytest.mark.system
def test_restarted_recorder_resumes_the_file_and_loses_nothing(tmp_path, spawn):
    path = str(tmp_path / "run.h5")
    endpoint = local_endpoint()
    # a flush interval long enough that something is always unflushed
    recorder = start_recorder(spawn, path, endpoint, flush_interval_s=1.0)
    control = ControlClient(endpoint)
    pub = BusPublisher(endpoint, backlog_bytes=8 << 20)
    pub.announce(descriptor())
    pub.wait_ready(20)
    seq = send_for(pub, 0, 1.0)
    wait_until(lambda: rows_received(control) > 0)
    # kill while batches still arrive: a kill after a pause (CI once paused through the
    # next flush) finds everything on disk and leaves nothing to resend
    seq = send_for(pub, seq, 0.2)
    kill(recorder)  # mid-run: rows after the last flush are only in the sources' windows
    assert len(index_column(path)) < seq * ROWS, "the kill found every row on disk"
    seq = send_for(pub, seq, 0.3)
    recorder = start_recorder(spawn, path, endpoint, resume=True)
    seq = send_for(pub, seq, 1.0)
    pub.end("meter", seq - 1)
    pub.close()
    final = stop(control, recorder)
    assert final["resumed"] is True
    assert pub.resent_batches > 0
    index = index_column(path)
    np.testing.assert_array_equal(index, np.arange(seq * ROWS))
    with wattlab.open(path) as run:
        assert run.gaps == []
        assert "recorder restarted" in [m.name for m in run.markers]
    assert crash_flags(path) == 0


@pytest.mark.system
def test_loss_beyond_the_replay_window_is_recorded_exactly(tmp_path, spawn):
    """Away longer than window + backlog: the publisher stalls, says hello to the new
    recorder, resends its window, and the rest is one exact gap.

    Counted in batches, not seconds, and with no flush before the kill: what the window
    holds then does not depend on how fast a loaded machine ran (CI once saw the recorder's
    flush land just before the kill, leaving nothing to resend).
    """
    path = str(tmp_path / "run.h5")
    endpoint = local_endpoint()
    recorder = start_recorder(spawn, path, endpoint, flush_interval_s=3600.0)
    control = ControlClient(endpoint)
    batch_bytes = ROWS * (8 + 16) + 200
    pub = BusPublisher(endpoint, window_bytes=150 * batch_bytes, backlog_bytes=50 * batch_bytes)
    pub.announce(descriptor())
    pub.wait_ready(20)
    seq = send_batches(pub, 0, 40)
    wait_until(lambda: rows_received(control) == seq * ROWS)
    kill(recorder)
    seq = send_batches(pub, seq, 400)  # far more than window + backlog
    recorder = start_recorder(spawn, path, endpoint, resume=True)
    seq = send_until(pub, seq, lambda: pub.resent_batches > 0, timeout_s=60)
    seq = send_batches(pub, seq, 40)
    pub.end("meter", seq - 1)
    pub.close()
    stop(control, recorder)
    assert pub.resent_batches > 0
    assert pub.dropped_batches > 0
    with wattlab.open(path) as run:
        index = run.source("meter").channel("index")
        gaps = run.gaps
    assert gaps, "the loss must be in /gaps"
    lost = sum(g.samples_lost for g in gaps)
    assert all(g.samples_lost > 0 and g.seq_first >= 0 and g.seq_last >= g.seq_first
               for g in gaps), gaps
    assert len(index) + lost == seq * ROWS  # every row is either in the file or in a gap
    missing = np.setdiff1d(np.arange(seq * ROWS), index)
    for g in gaps:  # the gap's sequence range is exactly the missing rows
        expected = np.arange(g.seq_first * ROWS, (g.seq_last + 1) * ROWS)
        assert np.isin(expected, missing).all()
    assert np.all(np.diff(index) > 0)


@pytest.mark.fast
def test_resume_cuts_partial_rows_back_to_the_last_progress_record(tmp_path):
    """A dataset longer than the others (a write the crash interrupted) is cut back."""
    path = str(tmp_path / "run.h5")
    writer = RunFileWriter(path, {}, 0)
    writer.add_source(descriptor())
    b = batch(0)
    flags = np.zeros(ROWS, dtype=np.uint8)
    writer.append("meter", b.t_host_ns, b.t_host_ns, b.values, flags)
    writer.add_progress([("meter", 1, ROWS, False)])
    writer.close(fit_device_clocks=False)
    with h5py.File(path, "r+") as f:  # a second batch half-written: time but not values
        ds = f["sources/meter/time"]
        ds.resize(ROWS + 50, axis=0)
    resumed, points = RunFileWriter.resume(path, 0)
    resumed.close(fit_device_clocks=False)
    assert points["meter"].seq_next == 1 and points["meter"].rows == ROWS
    assert points["meter"].rows_dropped == 50
    with wattlab.open(path) as run:
        assert len(run.source("meter")) == ROWS


@pytest.mark.fast
def test_crash_flag_repair_is_checked_and_exact(tmp_path):
    assert lookup3(b"") == 0xDEADBEEF
    assert lookup3(b"Four score and seven years ago") == 0x17770551  # lookup3.c's self-test
    path = tmp_path / "junk.h5"
    path.write_bytes(os.urandom(64))
    with pytest.raises(RunFileError, match="not an HDF5 file"):
        clear_crash_flags(str(path))
    clean = str(tmp_path / "clean.h5")
    RunFileWriter(clean, {}, 0).close(fit_device_clocks=False)
    assert clear_crash_flags(clean) is False
    raw = bytearray((tmp_path / "clean.h5").read_bytes())
    raw[40] ^= 0xFF  # corrupt a superblock address: the checksum catches it
    (tmp_path / "bad.h5").write_bytes(bytes(raw))
    with pytest.raises(RunFileError, match="checksum"):
        clear_crash_flags(str(tmp_path / "bad.h5"))
