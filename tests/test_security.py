"""CurveZMQ on the remote bus: keys, refused peers, and agents bound to their own streams."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

import wattlab
from wattlab.cli import main
from wattlab.errors import BusError, UsageError
from wattlab.samples import Channel, Marker, SampleBatch, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.bus.publisher import BusPublisher, ControlClient, local_endpoint
from wattlab.sync.bus.security import (
    ClientSecurity,
    load_allowed_keys,
    load_keypair,
    load_public_key,
)
from wattlab.sync.clock_service import ClockResponder
from wattlab.sync.recorder.process import Recorder, RecorderConfig


def client(keys: Path, name: str, server: str = "recorder") -> ClientSecurity:
    return ClientSecurity(load_keypair(keys / f"{name}.key_secret"),
                          load_public_key(keys / f"{server}.key"))


def desc(source_id: str) -> SourceDescriptor:
    return SourceDescriptor(source_id, "test", "Remote meter", (Channel("power_w", "W"),))


def batch(source_id: str, seq: int, n: int = 50) -> SampleBatch:
    t = time.monotonic_ns() + np.arange(n, dtype=np.int64) * 1000
    return SampleBatch(source_id, seq, t, np.full((n, 1), float(seq)))


class RemoteRecorder:
    """A listening recorder on a thread, stopped through the local control path."""

    def __init__(self, tmp_path: Path, keys: Path) -> None:
        self.endpoint = local_endpoint()
        self.path = str(tmp_path / "run.h5")
        self.recorder = Recorder(RecorderConfig(
            endpoint=self.endpoint, output=self.path, session_start_ns=0,
            listen="tcp://127.0.0.1:0", server_key=str(keys / "recorder.key_secret"),
            allowed_keys=str(keys / "allowed"), flush_interval_s=0.05, drain_timeout_s=1.0))
        self.listen = self.recorder.listen_endpoint
        self.thread = threading.Thread(target=self.recorder.run)
        self.thread.start()
        self.control = ControlClient(self.endpoint)

    def status(self) -> dict:
        return self.control.request("status", 5)

    def wait(self, predicate, timeout_s: float = 10) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status()
            if predicate(status):
                return status
            time.sleep(0.05)
        raise AssertionError(f"condition not met: {self.status()}")

    def stop(self) -> dict:
        try:
            return self.control.request("stop", 20)
        finally:
            self.control.close()
            self.thread.join(20)


@pytest.mark.fast
def test_keys_are_private_files_and_never_overwritten(keys, tmp_path):
    for path in keys.glob("*.key*"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert main(["keys", "node1", "-d", str(keys)]) == 2
    assert main(["keys", "bad.name", "-d", str(tmp_path)]) == 2
    secret = tmp_path / "loose.key_secret"
    secret.write_bytes((keys / "node1.key_secret").read_bytes())
    os.chmod(secret, 0o644)
    with pytest.raises(UsageError, match="readable by others"):
        load_keypair(secret)
    with pytest.raises(UsageError, match="no secret key"):
        os.chmod(keys / "node1.key", 0o600)
        load_keypair(keys / "node1.key")
    assert sorted(load_allowed_keys(keys / "allowed").values()) == ["node1", "node2"]


@pytest.mark.system
def test_listening_needs_keys_and_tcp(tmp_path, keys):
    base = {"endpoint": local_endpoint(), "session_start_ns": 0}
    with pytest.raises(UsageError, match="secret key"):
        Recorder(RecorderConfig(output=str(tmp_path / "a.h5"), listen="tcp://127.0.0.1:0",
                                **base))
    with pytest.raises(UsageError, match="tcp://"):
        Recorder(RecorderConfig(output=str(tmp_path / "b.h5"),
                                listen=f"ipc://{tmp_path / 'bus.sock'}",
                                server_key=str(keys / "recorder.key_secret"),
                                allowed_keys=str(keys / "allowed"), **base))
    assert not (tmp_path / "a.h5").exists()


@pytest.mark.system
def test_unlisted_or_keyless_peers_are_refused_and_inject_nothing(tmp_path, keys, caplog):
    rec = RemoteRecorder(tmp_path, keys)
    context = zmq.Context.instance()
    intruders = [BusPublisher(rec.listen, linger_ms=0, security=client(keys, "intruder")),
                 BusPublisher(rec.listen, linger_ms=0, security=client(keys, "node1",
                                                                       server="intruder"))]
    plain = context.socket(zmq.DEALER)
    plain.setsockopt(zmq.LINGER, 0)
    plain.setsockopt(zmq.SNDTIMEO, 1000)  # once refused it has no pipe: a send would block
    plain.connect(rec.listen)
    legit = BusPublisher(rec.listen, security=client(keys, "node1"))
    responder = ClockResponder(rec.listen, "node1", configure=client(keys, "node1").apply)
    responder.start()
    try:
        for i, pub in enumerate(intruders):
            # a refused peer has no connection to queue on: its sends may time out (the
            # error says so); either way nothing of it may reach the file
            with contextlib.suppress(BusError):
                pub.announce(desc(f"node1.fake{i}"))
                pub.send_batch(batch(f"node1.fake{i}", 0))
                pub.send_marker(Marker(time.monotonic_ns(), "injected", source="node1"))
        with contextlib.suppress(zmq.Again):
            plain.send_multipart(message.encode_descriptor(desc("node1.plain")))
            plain.send_multipart(message.encode_marker(Marker(1, "injected", source="node1")))
        legit.announce(desc("node1.meter"))
        legit.wait_ready(10)
        for seq in range(3):
            legit.send_batch(batch("node1.meter", seq))
        legit.send_marker(Marker(time.monotonic_ns(), "real", source="node1.meter"))
        legit.end("node1.meter", 2)
        legit.close()
        status = rec.wait(lambda s: s["sources"].get("node1.meter", {}).get("ended"))
        assert status["refused_peers"] >= 1
        assert "peer(s) with an unknown CURVE key" in caplog.text
    finally:
        for pub in intruders:
            pub.close()
        plain.close()
        rec.stop()
        responder.stop()
    with wattlab.open(rec.path) as run:
        assert list(run.sources) == ["node1.meter"]
        assert len(run.source("node1.meter")) == 150
        assert [m.name for m in run.markers] == ["real"]


@pytest.mark.system
def test_an_agent_can_only_speak_for_its_own_streams(tmp_path, keys):
    rec = RemoteRecorder(tmp_path, keys)
    node1 = BusPublisher(rec.listen, linger_ms=2000, security=client(keys, "node1"))
    responder = ClockResponder(rec.listen, "node1", configure=client(keys, "node1").apply)
    responder.start()
    local = BusPublisher(rec.endpoint)
    try:
        node1.announce(desc("node1.meter"))
        node1.wait_ready(10)
        rejected_before = rec.status()["rejected"]
        attacks = [
            message.encode_descriptor(desc("node2.meter")),  # another agent's name
            message.encode_descriptor(desc("gpu0")),  # the recorder host's own name space
            message.encode_batch(batch("node2.meter", 0)),
            message.encode_marker(Marker(1, "fake", source="node2")),
            message.encode_control("stop", rid="x"),  # agents never control the session
            message.encode_clock("node2", hello=True),  # nor pose as another host's clock
            message.encode_clock("node1", hello=True, sources=["node2.meter"]),
        ]
        for frames in attacks:
            node1._socket.send(frames)
        bad = message.encode_batch(batch("node1.meter", 0))
        bad[3] = b"\x00" * 3  # values buffer shorter than the header says
        node1._socket.send(bad)
        # a local peer sending a remote stream
        local._socket.send(message.encode_batch(batch("node1.meter", 5)))
        status = rec.wait(lambda s: s["rejected"] >= rejected_before + len(attacks) + 2)
        assert "hosts" in status and status["sources"]["node1.meter"]["rows"] == 0
        for seq in range(2):
            node1.send_batch(batch("node1.meter", seq))
        node1.end("node1.meter", 1)
        node1.close()
        rec.wait(lambda s: s["sources"]["node1.meter"]["ended"])
    finally:
        local.close()
        final = rec.stop()
        responder.stop()
    assert final["stopped"] is True
    with wattlab.open(rec.path) as run:
        assert list(run.sources) == ["node1.meter"]
        assert len(run.source("node1.meter")) == 100
        assert run.markers == []
        status = json.loads(run.attrs["recorder_status_json"])
        assert status["hosts"]["node1"]["sources"] == ["node1.meter"]


@pytest.mark.fast
def test_a_flood_of_unknown_keys_is_one_log_line_a_second_with_its_count(caplog):
    """A client retrying with fresh keys wrote a line per handshake (9,744 in 10 s)."""
    from wattlab.sync.bus.security import _AllowList

    allow = _AllowList({b"k" * 40: "node1"})
    with caplog.at_level("WARNING", logger="wattlab.security"):
        for i in range(1000):
            assert not allow.callback("global", b"x%039d" % i)
        assert allow.callback("global", b"k" * 40)
    assert allow.refused == 1000
    lines = [r.getMessage() for r in caplog.records if "unknown CURVE key" in r.getMessage()]
    assert len(lines) == 1, len(lines)
    allow.log.flush_lines()  # at close: the rest with their count
    assert "refused 999 peer(s) with an unknown CURVE key (1000 in all" in caplog.text
