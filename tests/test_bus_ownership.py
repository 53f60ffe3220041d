"""A stream's rows come only from the client that described it (issue 36, item 2).

A second local client (a confused workload, another recorder's source) that sends batches,
gaps or an end for a stream it did not describe is refused and counted; the real rows all
reach the file, and the refused batches are a gap row, not silence.
"""

from __future__ import annotations

import numpy as np
import pytest

import wattlab
from tests.conftest import batch, descriptor, synced
from wattlab.samples import Gap, SampleBatch
from wattlab.sync.bus import message

OWNER_REFUSAL = "message(s) for streams other clients described"


def forged(source: str, seq: int) -> SampleBatch:
    """What the issue's attacker sent: NaN values and times that go backwards."""
    t = np.array([5_000_000, 1_000], dtype=np.int64)
    return SampleBatch(source, seq, t, np.full((2, 2), np.nan, dtype="<f4"))


@pytest.mark.system
def test_a_second_client_cannot_drop_or_stop_another_clients_stream(recorder):
    rec = recorder(flush_interval_s=0.05)
    owner = rec.publisher(descriptor("gpu0"))
    owner.wait_ready(5)
    for seq in range(3):
        owner.send_batch(batch("gpu0", seq))
    assert owner.sync(5)
    with rec.raw_client() as stranger:
        for seq in (3, 4):
            stranger.send_multipart(message.encode_batch(forged("gpu0", seq)), copy=False)
        stranger.send_multipart(message.encode_gap(Gap("gpu0", "forged", 5, 5)))
        stranger.send_multipart(message.encode_end("gpu0", 6))
        stranger.send_multipart(message.encode_descriptor(descriptor("gpu0")))
        synced(stranger)
    for seq in range(3, 10):
        owner.send_batch(batch("gpu0", seq))
    owner.end("gpu0", 9)
    owner.close()
    reply = rec.stop()
    with wattlab.open(rec.path) as run:
        view = run.source("gpu0")
        assert len(view) == 1000
        expected = np.concatenate([batch("gpu0", seq).values for seq in range(10)])
        np.testing.assert_array_equal(view.values, expected)
        gaps = [(g.source, g.reason, g.samples_lost) for g in run.gaps]
    assert gaps == [("gpu0", "batch from a client that does not own the stream: 2 dropped",
                     4)]
    assert reply["refused"][OWNER_REFUSAL] == 5
    assert reply["sources"]["gpu0"]["duplicates"] == 0


@pytest.mark.system
def test_a_restarted_source_takes_over_its_ended_stream(recorder):
    """A new client may describe a stream again once it ended (a restarted source)."""
    rec = recorder(flush_interval_s=0.05)
    for seq in (0, 1):  # the first client, then its restart
        client = rec.publisher(descriptor("meter"))
        client.wait_ready(5)
        client.send_batch(batch("meter", seq))
        client.end("meter", seq)
        client.close()
    reply = rec.stop()
    assert reply["refused"] == {}
    with wattlab.open(rec.path) as run:
        assert len(run.source("meter")) == 200


@pytest.mark.system
def test_a_batch_whose_sequence_numbers_were_taken_is_a_gap_row_not_silence(recorder):
    rec = recorder()
    with rec.raw_client() as owner:
        owner.send_multipart(message.encode_descriptor(descriptor("meter")))
        for seq in (0, 1, 1):
            owner.send_multipart(message.encode_batch(batch("meter", seq)), copy=False)
        owner.send_multipart(message.encode_end("meter", 1))
        synced(owner)
    reply = rec.stop()
    assert reply["sources"]["meter"]["duplicates"] == 1
    with wattlab.open(rec.path) as run:
        assert len(run.source("meter")) == 200
        gaps = [(g.source, g.reason, g.samples_lost) for g in run.gaps]
    assert gaps == [("meter", "batch with sequence numbers already taken: 1 dropped", 100)]


@pytest.mark.system
def test_waiting_batches_of_another_client_are_not_taken_with_the_descriptor(recorder):
    """Batches that came before any descriptor belong to whoever then describes the stream."""
    rec = recorder()
    with rec.raw_client() as stranger:
        stranger.send_multipart(message.encode_batch(forged("meter", 0)), copy=False)
        synced(stranger)
    owner = rec.publisher(descriptor("meter"))
    owner.send_batch(batch("meter", 0))
    owner.end("meter", 0)
    owner.close()
    rec.stop()
    with wattlab.open(rec.path) as run:
        np.testing.assert_array_equal(run.source("meter").values, batch("meter", 0).values)
