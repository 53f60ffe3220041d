"""Markers from the measured program: ``wattlab.mark()`` and ``with wattlab.phase():``.

The session puts its bus endpoint in ``WATTLAB_BUS``; a program run outside a session
has no such variable and every call is a silent no-op, so instrumented code runs anywhere.
Bad input (a name too long, a payload that is not JSON) is an error in both cases, so a
mistake shows up the first time the code runs, not only on the bench.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from wattlab.samples import Marker
from wattlab.sync.bus import BusPublisher

BUS_ENV = "WATTLAB_BUS"

_lock = threading.Lock()
_publishers: dict[int, BusPublisher] = {}


def _publisher() -> BusPublisher | None:
    endpoint = os.environ.get(BUS_ENV)
    if not endpoint:
        return None
    key = threading.get_ident()
    with _lock:
        pub = _publishers.get(key)
        if pub is None:
            pub = BusPublisher(endpoint, linger_ms=5000)
            _publishers[key] = pub
            if len(_publishers) == 1:
                atexit.register(_close_all)
        return pub


def _close_all() -> None:
    """Deliver queued markers before the interpreter exits (bounded by the linger time)."""
    with _lock:
        for pub in _publishers.values():
            pub.close()
        _publishers.clear()


def mark(name: str, kind: str = "point", **payload: Any) -> None:
    """Record a named instant (``kind="point"``) or a phase boundary in the session's run."""
    marker = Marker(time.monotonic_ns(), name, kind, f"pid{os.getpid()}", dict(payload))
    pub = _publisher()
    if pub is not None:
        pub.send_marker(marker)


@contextmanager
def phase(name: str, **payload: Any) -> Iterator[None]:
    """Mark the beginning and end of a phase (the end is marked even if the body raises)."""
    mark(name, "begin", **payload)
    try:
        yield
    finally:
        mark(name, "end")
