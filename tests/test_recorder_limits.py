"""Floods from one local client are bounded, refused and counted (issue 36, item 5)."""

from __future__ import annotations

import uuid

import pytest

import wattlab
from tests.conftest import batch, descriptor, synced
from wattlab.samples import Marker
from wattlab.sync.bus import message
from wattlab.sync.bus.publisher import ControlClient
from wattlab.sync.recorder import stream_order
from wattlab.sync.recorder.admission import gate, limits


@pytest.mark.system
def test_batches_of_undescribed_streams_are_kept_for_a_bounded_number_of_streams(recorder):
    rec = recorder()
    with rec.raw_client() as flood:
        for i in range(limits.MAX_ORPHAN_STREAMS + 10):
            flood.send_multipart(message.encode_batch(batch(f"ghost{i}", 0)), copy=False)
        synced(flood)
    reply = rec.stop()
    refused = reply["refused"]["batch(es) for streams over the limits or of other clients"]
    assert refused == 10
    with wattlab.open(rec.path) as run:
        reasons = [g.reason for g in run.gaps]
    assert reasons.count("never described; batches dropped") == limits.MAX_ORPHAN_STREAMS
    assert sum("past the first 64: 1 dropped" in r for r in reasons) == 10


@pytest.mark.system
def test_held_bytes_of_undescribed_streams_are_bounded(recorder, monkeypatch):
    monkeypatch.setattr(stream_order, "MAX_ORPHAN_BYTES", 3 * 1600)  # three 100-row batches
    rec = recorder()
    with rec.raw_client() as flood:
        for seq in range(5):
            flood.send_multipart(message.encode_batch(batch("ghost", seq)), copy=False)
        synced(flood)
    reply = rec.stop()
    assert reply["refused"]["batch(es) for streams over the limits or of other clients"] == 2


@pytest.mark.system
def test_new_streams_from_one_client_are_rate_limited(recorder, monkeypatch):
    monkeypatch.setattr(gate, "NEW_STREAMS_BURST", 3)
    monkeypatch.setattr(gate, "NEW_STREAMS_PER_S", 1e-6)
    # in SWMR mode from the first flush on (a stream that never comes is expected)
    rec = recorder(expected_sources=["later"], swmr_after_s=0.0, flush_interval_s=0.05)
    control = ControlClient(rec.endpoint)
    try:
        while not control.request("status", timeout_s=5)["swmr"]:
            pass
    finally:
        control.close()
    with rec.raw_client() as flood:
        for i in range(8):
            flood.send_multipart(message.encode_descriptor(descriptor(f"new{i}")))
        synced(flood)
    pub = rec.publisher(descriptor("meter"))  # another client has its own allowance
    pub.wait_ready(5)
    pub.send_batch(batch("meter", 0))
    pub.end("meter", 0)
    pub.close()
    reply = rec.stop()
    assert reply["refused"]["new stream(s) over the limit"] == 5
    assert sorted(reply["sources"]) == ["meter", "new0", "new1", "new2"]


@pytest.mark.system
def test_markers_over_a_clients_rate_are_refused_and_counted_in_a_gap_row(recorder,
                                                                          monkeypatch):
    monkeypatch.setattr(gate, "MARKERS_BURST", 20)
    monkeypatch.setattr(gate, "MARKERS_PER_S", 1e-6)
    rec = recorder()
    with rec.raw_client() as flood:
        for i in range(100):
            flood.send_multipart(message.encode_marker(Marker(i, f"m{i}")))
        synced(flood)
    reply = rec.stop()
    assert reply["refused"]["marker(s) over the rate limit"] == 80
    with wattlab.open(rec.path) as run:
        assert len(run.markers) == 20
        gaps = [(g.source, g.reason) for g in run.gaps]
    assert gaps == [("workload", "marker over its sender's rate limit (1e-06/s): 80 dropped")]


@pytest.mark.system
def test_a_frame_over_the_limit_is_never_received_whole(recorder):
    """ZMQ_MAXMSGSIZE drops the connection: the frame never reaches the recorder's loop."""
    rec = recorder()
    with rec.raw_client() as big:
        big.send_multipart([b"t", b"x" * (limits.MAX_FRAME_BYTES + 1)])
        rid = uuid.uuid4().hex
        big.send_multipart(message.encode_control("sync", rid=rid))
        big.poll(2000)  # the sync is lost with the connection (or answered after a reconnect)
    control = ControlClient(rec.endpoint)
    try:
        status = control.request("status", timeout_s=5)
    finally:
        control.close()
    rec.stop()
    assert status["rejected"] == 0


@pytest.mark.fast
def test_a_token_bucket_allows_its_burst_then_its_rate():
    bucket = limits.TokenBucket(burst=2, per_s=1.0, tokens=2, at_s=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
    assert bucket.take(0.5) is False
    assert bucket.take(1.0) is True
    assert bucket.take(1.0) is False
