"""Refusals are logged at most once a second per kind, with counts (issue 36, item 6)."""

from __future__ import annotations

import pytest
import zmq

from tests.conftest import RunningRecorder, batch, descriptor, synced
from wattlab.sync.bus.publisher import BusPublisher
from wattlab.sync.bus.refusal_log import RefusalLog


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


@pytest.mark.fast
def test_a_flood_of_one_kind_is_one_line_a_second_with_its_count():
    lines: list[str] = []
    clock = Clock()
    log = RefusalLog(lines.append, clock=clock)
    for i in range(1000):
        log.note("garbage", f"message {i}")
    assert lines == ["refused 1 garbage (1 in all; at most one line a second): message 0"]
    clock.now_s += 1.0
    log.note("garbage", "message 1000")
    log.note("handshakes", "key K")
    assert lines[1:] == [
        "refused 1000 garbage (1001 in all; at most one line a second): message 1000",
        "refused 1 handshakes (1 in all; at most one line a second): key K",
    ]
    log.note("garbage", "message 1001")
    log.flush_lines()
    assert lines[3:] == ["refused 1 garbage (1002 in all; at most one line a second): "
                         "message 1001"]
    assert log.counts == {"garbage": 1002, "handshakes": 1}
    log.flush_lines()
    assert len(lines) == 4  # nothing new: nothing said


@pytest.mark.system
def test_garbage_on_the_local_bus_costs_a_line_a_second_not_a_line_each(tmp_path, capsys):
    rec = RunningRecorder(str(tmp_path / "run.h5"))
    bad = zmq.Context.instance().socket(zmq.DEALER)
    bad.setsockopt(zmq.LINGER, 0)
    bad.connect(rec.endpoint)
    for _ in range(500):
        bad.send_multipart([b"t", b"not json"])
    synced(bad)
    pub = BusPublisher(rec.endpoint)  # the session goes on
    pub.announce(descriptor())
    pub.send_batch(batch("meter", 0))
    pub.end("meter", 0)
    pub.close()
    bad.close(0)
    reply = rec.stop()
    assert reply["rejected"] == 500
    lines = [line for line in capsys.readouterr().err.splitlines() if "malformed" in line]
    assert 1 <= len(lines) <= 3, lines  # the first, maybe one a second later, the rest at close
    assert "(500 in all" in lines[-1]
