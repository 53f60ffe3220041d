"""Idle or slow scrapers cannot hold more than a few threads of the recorder (issue 36, 8)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from wattlab.sync.recorder.prometheus import MAX_SCRAPES_IN_FLIGHT, Exporter
from wattlab.sync.recorder.stream_metrics import StreamMetrics

pytest.importorskip("prometheus_client")


def _threads_settle(expected: int, timeout_s: float = 5.0) -> int:
    """The thread count once the server took every connection (bounded wait, no tuning)."""
    deadline = time.monotonic() + timeout_s
    while threading.active_count() < expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return threading.active_count()


@pytest.mark.system
def test_idle_connections_hold_at_most_the_scrape_slots():
    exporter = Exporter("127.0.0.1:0", StreamMetrics())
    before = threading.active_count()
    idle = [socket.create_connection((exporter.host, exporter.port)) for _ in range(40)]
    try:
        deadline = time.monotonic() + 5
        while exporter.refused_connections < 1:
            assert time.monotonic() < deadline, exporter.refused_connections
            time.sleep(0.02)
        assert _threads_settle(before + MAX_SCRAPES_IN_FLIGHT) - before <= MAX_SCRAPES_IN_FLIGHT
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 10  # the held slots free as their sockets close
    while True:
        try:
            with urllib.request.urlopen(f"{exporter.url}", timeout=5) as reply:
                assert reply.status == 200
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    exporter.close()
