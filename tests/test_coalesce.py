"""Publisher-side coalescing: joined batches keep their sequence range, nothing is lost."""

from __future__ import annotations

import numpy as np
import pytest

import wattlab
from tests.conftest import RunningRecorder, batch, descriptor
from wattlab.errors import MalformedMessageError, UsageError
from wattlab.samples import SampleBatch
from wattlab.sync.bus import message
from wattlab.sync.bus.coalesce import Coalescer
from wattlab.sync.bus.publisher import BusPublisher


@pytest.mark.fast
def test_consecutive_batches_join_up_to_the_row_limit():
    c = Coalescer(max_rows=250)
    assert c.add(batch("a", 0)) == []
    assert c.add(batch("a", 1)) == []
    [joined] = c.add(batch("a", 2))
    assert (joined.seq, joined.last_seq, joined.n) == (0, 2, 300)
    np.testing.assert_array_equal(joined.values[100:200], batch("a", 1).values)
    assert c.take_all() == []


@pytest.mark.fast
def test_a_sequence_jump_or_another_shape_is_never_joined():
    c = Coalescer(max_rows=10_000)
    c.add(batch("a", 0))
    [first] = c.add(batch("a", 2))
    assert (first.seq, first.last_seq) == (0, 0)
    [held] = c.add(batch("a", 3, width=3))
    assert (held.seq, held.last_seq) == (2, 2)
    [last] = c.take_all()
    assert last.values.shape[1] == 3


@pytest.mark.fast
def test_seq_last_round_trips_and_is_validated():
    joined = SampleBatch("a", 4, np.arange(3), np.ones((3, 1)), seq_last=9)
    frames = message.encode_batch(joined)
    head = message.decode_header(frames)
    assert message.decode_batch(head, frames).last_seq == 9
    head["seq_last"] = 2
    with pytest.raises(MalformedMessageError, match="seq_last"):
        message.decode_batch(head, frames)
    with pytest.raises(UsageError):
        SampleBatch("a", 4, np.arange(3), np.ones((3, 1)), seq_last=1)


@pytest.mark.system
def test_coalesced_stream_lands_whole_and_a_lost_range_is_reported(tmp_path):
    path = str(tmp_path / "run.h5")
    rec = RunningRecorder(path)
    pub = BusPublisher(rec.endpoint, coalesce_rows=1000)
    pub.announce(descriptor())
    for seq in (*range(0, 25), *range(30, 40)):
        pub.send_batch(batch("meter", seq))
    pub.end("meter", 39)
    pub.close()
    status = rec.stop()
    assert status["sources"]["meter"]["batches"] < 10
    with wattlab.open(path) as run:
        view = run.source("meter")
        assert len(view) == 3500
        np.testing.assert_array_equal(view.values[2400:2500], batch("meter", 24).values)
        assert [(g.seq_first, g.seq_last, g.reason) for g in run.gaps] == [
            (25, 29, "sequence gap")]
