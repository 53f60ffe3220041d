"""Random and hostile bus messages: the recorder rejects and counts them, never crashes."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wattlab
from wattlab.samples import Channel, SampleBatch, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.bus.publisher import BusPublisher, ControlClient, local_endpoint
from wattlab.sync.recorder.process import Recorder, RecorderConfig

pytestmark = pytest.mark.system

KEYS = ["v", "type", "source", "seq", "seq_last", "n", "buffers", "body", "command", "rid",
        "last_seq", "ack", "describe", "resend", "from_seq", "durable", "seq_next", "source_id",
        "reason", "hello", "probe", "sources", "seq_first", "t_first_ns", "t_last_ns",
        "samples_lost", "t_host_ns", "name", "kind", "payload", "t2", "t3"]
JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.text(max_size=20),
              st.floats(allow_nan=False, allow_infinity=False),
              st.sampled_from(["batch", "descriptor", "marker", "gap", "end", "control", "meter",
                               "stop", "status", "sync", "source_lost", "<f4", "<i8", "|u1"])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from([*KEYS, "dtype", "shape"]), inner, max_size=6)),
    max_leaves=12,
)
HEADERS = st.dictionaries(st.sampled_from(KEYS), JSONISH, max_size=8).map(
    lambda d: {"v": 1, **d} if d.get("v") is None else d)
FRAMES = st.one_of(
    st.lists(st.binary(max_size=64), max_size=5),
    st.tuples(st.binary(max_size=8), HEADERS.map(lambda h: json.dumps(h).encode()),
              st.lists(st.binary(max_size=64), max_size=4)).map(lambda t: [t[0], t[1], *t[2]]),
)


def descriptor(source_id: str = "meter") -> SourceDescriptor:
    return SourceDescriptor(source_id, "test", "Fuzz", (Channel("power_w", "W"),),
                            value_dtype="<f4")


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = str(tmp_path_factory.mktemp("fuzz") / "fuzz.h5")
    rec = Recorder(RecorderConfig(endpoint=local_endpoint(), output=path, session_start_ns=0))
    rec.handle([b"peer", *message.encode_descriptor(descriptor())])
    yield rec
    rec._finish()


@settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(FRAMES)
def test_handle_survives_any_frames(recorder: Recorder, frames: list[bytes]) -> None:
    """Everything a peer can send goes through ``handle``; only rejections come out."""
    before = recorder.rejected
    recorder.handle([b"peer", *frames])
    assert recorder.rejected >= before
    recorder.flush()  # what was accepted must also be writable


@settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.integers(0, 6), st.sampled_from(["seq", "n", "buffers", "dtype", "shape", "body"]),
       JSONISH, st.binary(max_size=40))
def test_mutated_valid_batches_are_rejected_cleanly(
        recorder: Recorder, index: int, field: str, value: Any, junk: bytes) -> None:
    good = message.encode_batch(SampleBatch("meter", 10_000 + index, np.arange(4, dtype=np.int64),
                                            np.ones((4, 1), dtype="<f4")))
    head = json.loads(bytes(good[1]))
    if field in ("dtype", "shape"):
        head["buffers"][index % 2][field] = value
    else:
        head[field] = value
    frames = [good[0], json.dumps(head).encode(), *good[2:]]
    if index % 3 == 0:
        frames[2 + index % 2] = junk
    recorder.handle([b"peer", *frames])
    recorder.flush()


def test_random_frames_over_the_socket_then_a_real_session(tmp_path):
    """A hostile peer on the real socket first; the session after it is recorded whole."""
    path = str(tmp_path / "run.h5")
    endpoint = local_endpoint()
    rec = Recorder(RecorderConfig(endpoint=endpoint, output=path, session_start_ns=0,
                                  flush_interval_s=0.05))
    thread = threading.Thread(target=rec.run)
    thread.start()
    hostile = zmq.Context.instance().socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    hostile.connect(endpoint)
    rng = np.random.default_rng(7)
    try:
        for i in range(300):
            n = int(rng.integers(1, 6))
            frames = [rng.bytes(int(rng.integers(0, 300))) for _ in range(n)]
            if i % 3 == 0 and n >= 2:  # a plausible header over random buffers
                frames[1] = json.dumps({"v": 1, "type": "batch", "source": "meter", "seq": i,
                                        "n": int(rng.integers(0, 50)),
                                        "buffers": [{"name": "values", "dtype": "<f4",
                                                     "shape": [3, 1]}]}).encode()
            hostile.send_multipart(frames)
        # the router fair-queues peers: let every hostile message be judged before the
        # real session starts, so the count below is exact
        deadline = time.monotonic() + 20
        while rec.rejected < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        pub = BusPublisher(endpoint)
        pub.announce(descriptor())
        pub.wait_ready(10)
        for seq in range(5):
            pub.send_batch(SampleBatch("meter", seq, np.arange(10, dtype=np.int64) + seq * 10,
                                       np.full((10, 1), seq, dtype="<f4")))
        pub.end("meter", 4)
        pub.close()
        control = ControlClient(endpoint)
        reply = control.request("stop", timeout_s=20)
        control.close()
    finally:
        hostile.close()
        rec.request_stop()  # a no-op after the stop above; on a failure it ends the thread,
        thread.join(20)  # which otherwise keeps the test process alive at exit
    assert reply["rejected"] == 300  # every hostile message, none of the real ones
    with wattlab.open(path) as run:
        assert len(run.source("meter")) == 50
        assert run.gaps == []


@pytest.mark.parametrize("head", [
    {"type": "gap", "source": "meter", "body": {"reason": "x", "seq_first": 2**63}},
    {"type": "gap", "source": "meter", "body": {"reason": "x", "t_first_ns": 2**70}},
    {"type": "gap", "source": "meter", "body": {"reason": "x", "samples_lost": -2**70}},
    {"type": "marker", "source": "w", "body": {"t_host_ns": 2**70, "name": "a"}},
    {"type": "end", "source": "meter", "last_seq": 2**64},
    {"type": "batch", "source": "meter", "seq": 2**63, "n": 0, "buffers": []},
])
def test_integers_too_big_for_the_file_are_rejected_not_fatal(recorder: Recorder,
                                                             head: dict[str, Any]) -> None:
    """Found by fuzzing: these once passed validation and crashed the recorder's flush."""
    before = recorder.rejected
    recorder.handle([b"peer", b"x", json.dumps({"v": 1, **head}).encode()])
    recorder.flush()
    assert recorder.rejected == before + 1
