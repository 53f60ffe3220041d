"""Recorder + bus + run file, with real ZeroMQ sockets and real HDF5 files."""

from __future__ import annotations

import time

import h5py
import numpy as np
import pytest

import wattlab
from tests.conftest import batch, descriptor, free_port, synced
from wattlab.errors import RunFileError, UsageError
from wattlab.samples import Channel, Gap, Marker, SampleBatch, SampleFlag, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.bus.publisher import BusPublisher, local_endpoint
from wattlab.sync.recorder.process import Recorder, RecorderConfig


@pytest.mark.system
def test_batches_reach_the_file_in_order_with_attributes(recorder):
    rec = recorder(flush_interval_s=0.05)
    pub = rec.publisher(descriptor())
    pub.wait_ready(5)
    for seq in range(20):
        pub.send_batch(batch("meter", seq))
    pub.send_marker(Marker(5_000, "epoch", "begin", "workload", {"epoch": 1}))
    pub.end("meter", 19)
    pub.close()
    reply = rec.stop()
    assert reply["stopped"] is True
    with wattlab.open(rec.path) as run:
        view = run.source("meter")
        assert len(view) == 2000
        assert view.channel_names == ["power0_w", "power1_w"]
        assert view.units == ["W", "W"]
        assert np.all(np.diff(view.time_ns) == 1000)
        np.testing.assert_array_equal(view.values[100:200], batch("meter", 1).values)
        assert view.model == "Bench 9000"
        assert run.gaps == []
        [m] = run.markers
        assert (m.name, m.kind, m.payload, m.time_ns) == ("epoch", "begin", {"epoch": 1}, 5_000)
        assert run.attrs["format_version"] == "1"


@pytest.mark.system
def test_sequence_gap_and_missing_tail_are_recorded(recorder):
    rec = recorder()
    pub = rec.publisher(descriptor())
    for seq in (0, 1, 4, 5):
        pub.send_batch(batch("meter", seq))
    pub.send_gap(Gap("meter", "resync: 7 corrupt bytes skipped", samples_lost=1))
    pub.end("meter", 7)
    pub.close()
    rec.stop()
    with wattlab.open(rec.path) as run:
        gaps = [(g.seq_first, g.seq_last, g.reason) for g in run.gaps]
        assert (2, 3, "sequence gap") in gaps
        assert (6, 7, "lost before the end") in gaps
        assert any("resync" in g[2] for g in gaps)
        assert len(run.source("meter")) == 400


@pytest.mark.system
def test_source_that_never_ends_is_reported(recorder):
    rec = recorder(drain_timeout_s=0.3)
    pub = rec.publisher(descriptor(), linger_ms=100)
    pub.send_batch(batch("meter", 0))
    pub.wait_ready(5)
    rec.stop()
    pub.close()
    with wattlab.open(rec.path) as run:
        assert [g.reason for g in run.gaps] == ["source did not end cleanly"]


@pytest.mark.system
def test_publisher_that_starts_before_the_recorder_loses_nothing(recorder):
    """Slow joiner: everything sent before the recorder bound is delivered in order."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    pub = BusPublisher(endpoint)
    pub.announce(descriptor())
    for seq in range(10):
        pub.send_batch(batch("meter", seq))
    time.sleep(0.1)
    rec = recorder("late.h5", endpoint=endpoint)
    pub.end("meter", 9)
    pub.close()
    _wait_until(lambda: rec.recorder.status()["sources"].get("meter", {}).get("ended", False))
    rec.stop()
    with wattlab.open(rec.path) as run:
        assert len(run.source("meter")) == 1000
        assert run.gaps == []


@pytest.mark.system
def test_batch_before_descriptor_triggers_a_describe_request(recorder):
    """A recorder that missed the descriptor (restart) asks the source to describe itself."""
    rec = recorder()
    with rec.raw_client() as sock:
        sock.send_multipart(message.encode_batch(batch("late", 0)), copy=False)
        assert sock.poll(5000)
        head = message.decode_header(sock.recv_multipart())
        assert head["describe"] == "late"
        sock.send_multipart(message.encode_descriptor(descriptor("late")))
        sock.send_multipart(message.encode_batch(batch("late", 1)), copy=False)
        sock.send_multipart(message.encode_end("late", 1))
        synced(sock)  # all three handled (was a 0.2 s sleep, which load outlasts)
    rec.stop()
    with wattlab.open(rec.path) as run:
        assert len(run.source("late")) == 200
        assert run.gaps == []


@pytest.mark.system
@pytest.mark.parametrize(
    "frames",
    [
        [b"x"],
        [b"t", b"not json"],
        [b"t", b'{"v": 99, "type": "batch", "source": "meter"}'],
        [b"t", b'{"v": 1, "type": "teleport", "source": "meter"}'],
        [b"t", b'{"v": 1, "type": "batch", "source": "meter", "seq": 0, "n": 2, '
               b'"buffers": [{"name": "t_host_ns", "dtype": "<i8", "shape": [2]}, '
               b'{"name": "values", "dtype": "<f4", "shape": [2, 2]}]}', b"\0" * 16, b"\0" * 3],
        [b"t", b'{"v": 1, "type": "batch", "source": "meter", "seq": -1, "n": 0, "buffers": []}'],
        [b"t", b'{"v": 1, "type": "batch", "source": "../etc", "seq": 0, "n": 0, "buffers": []}'],
        [b"t", b'{"v": 1, "type": "batch", "source": "meter", "seq": 0, "n": 1, '
               b'"buffers": [{"name": "t_host_ns", "dtype": "|O", "shape": [1]}]}', b"\0" * 8],
    ],
)
def test_malformed_messages_are_rejected_and_the_session_goes_on(recorder, frames):
    rec = recorder()
    with rec.raw_client() as bad:
        bad.send_multipart(frames)
        synced(bad)  # handled before the stop, however late a loaded machine delivers it
    pub = rec.publisher(descriptor())
    pub.send_batch(batch("meter", 0))
    pub.end("meter", 0)
    pub.close()
    reply = rec.stop()
    assert reply["rejected"] == 1
    with wattlab.open(rec.path) as run:
        assert len(run.source("meter")) == 100


@pytest.mark.system
def test_wrong_channel_count_is_rejected_and_recorded_as_a_gap(recorder):
    rec = recorder()
    pub = rec.publisher(descriptor(width=2))
    pub.send_batch(batch("meter", 0, width=3))
    pub.send_batch(batch("meter", 1, width=2))
    pub.end("meter", 1)
    pub.close()
    reply = rec.stop()
    assert reply["rejected"] == 1
    with wattlab.open(rec.path) as run:
        assert len(run.source("meter")) == 100
        assert [g.reason for g in run.gaps] == ["malformed batch rejected: channel count"]


@pytest.mark.system
def test_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "run.h5"
    path.write_bytes(b"precious")
    with pytest.raises(UsageError, match="already exists"):
        Recorder(RecorderConfig(endpoint=local_endpoint(), output=str(path), session_start_ns=0))
    assert path.read_bytes() == b"precious"


@pytest.mark.system
def test_live_reader_follows_a_growing_file_and_late_sources(recorder):
    rec = recorder(expected_sources=["meter"], flush_interval_s=0.05)
    pub = rec.publisher(descriptor())
    pub.send_batch(batch("meter", 0))
    pub.wait_ready(5)
    _wait_until(lambda: _rows(rec.path, "meter") == 100)
    with wattlab.open(rec.path) as live:
        assert len(live.source("meter")) == 100
        pub.send_batch(batch("meter", 1))
        deadline = time.monotonic() + 5
        while len(live.source("meter")) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
            live.refresh()
        assert len(live.source("meter")) == 200
    pub.announce(descriptor("late_source", width=1))
    pub.send_batch(batch("late_source", 0, width=1))
    pub.end("meter", 1)
    pub.end("late_source", 0)
    pub.close()
    rec.stop()
    with wattlab.open(rec.path) as run:
        assert len(run.source("late_source")) == 100
        assert len(run.source("meter")) == 200


@pytest.mark.system
def test_flags_and_raw_time_are_kept(recorder):
    rec = recorder()
    pub = BusPublisher(rec.endpoint)
    desc = SourceDescriptor("dev", "test", "X", (Channel("power_w", "W"),),
                            time_raw="device_us", time_raw_dtype="<i8")
    pub.announce(desc)
    flags = np.array([0, SampleFlag.OVERRANGE, SampleFlag.REPEAT], dtype=np.uint8)
    pub.send_batch(SampleBatch("dev", 0, np.array([10, 20, 30]), np.ones((3, 1)),
                               np.array([7, 8, 9]), flags))
    pub.end("dev", 0)
    pub.close()
    rec.stop()
    with wattlab.open(rec.path) as run:
        view = run.source("dev")
        np.testing.assert_array_equal(view.flags, flags)
        np.testing.assert_array_equal(view.time_raw, [7, 8, 9])
        frame = view.to_pandas()
        assert list(frame.columns) == ["time_raw", "power_w", "flags"]
        data = run.to_xarray()["dev"]
        assert data["power_w"].attrs["units"] == "W"
        np.testing.assert_array_equal(data["flags"].values, flags)
        np.testing.assert_allclose(data["time_s"].values, [10e-9, 20e-9, 30e-9])


@pytest.mark.fast
def test_reader_errors_name_the_file(tmp_path):
    with pytest.raises(RunFileError, match="no such file"):
        wattlab.open(str(tmp_path / "missing.h5"))
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all")
    with pytest.raises(RunFileError, match="not a readable HDF5"):
        wattlab.open(str(junk))
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = [1]
    with pytest.raises(RunFileError, match="not a wattlab run file"):
        wattlab.open(str(other))


def _rows(path: str, source: str) -> int:
    try:
        with wattlab.open(path) as run:
            return len(run.source(source)) if source in run.sources else 0
    except RunFileError:
        return 0


def _wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.mark.system
def test_a_burst_after_a_quiet_spell_costs_one_flush(recorder):
    """Issue 39: the NVML reader sends up to four messages at each emit; the recorder
    flushed the first at once and the rest a flush interval later (two HDF5 flushes).

    Three bursts, each after a quiet spell: before the change every burst cost two flushes.
    One burst of one flush is enough to pass, so a sender held up past the 20 ms wait by
    a loaded machine (its second message then a burst of its own) cannot fail the test.
    """
    rec = recorder(flush_interval_s=0.5)
    pub = rec.publisher(descriptor("a"), descriptor("b"))
    pub.wait_ready(5)
    writer = rec.recorder.writer
    flushes: list[float] = []
    real_flush = writer.flush
    writer.flush = lambda: (flushes.append(time.monotonic()), real_flush())  # type: ignore[method-assign]
    per_burst = []
    for seq in range(3):
        time.sleep(1.0)  # a quiet spell: the last flush (announcements, last burst) is old
        before = len(flushes)
        pub.send_batch(batch("a", seq))
        pub.send_batch(batch("b", seq))  # the rest of the burst, right behind its first
        time.sleep(1.2)  # past the flush interval: a second flush would have come by now
        per_burst.append(len(flushes) - before)
    assert 1 in per_burst, per_burst
    pub.end("a", 2)
    pub.end("b", 2)
    pub.close()
    rec.stop()
    with wattlab.open(rec.path) as run:
        assert len(run.source("a")) == len(run.source("b")) == 300
