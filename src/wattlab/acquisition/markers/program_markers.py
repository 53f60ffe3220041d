"""Markers from the measured program: ``wattlab.mark()``, ``with wattlab.phase():``, ``count``.

The session puts its bus endpoint in ``WATTLAB_BUS``; a program run outside a session
has no such variable and every call is a silent no-op, so instrumented code runs anywhere.
Bad input (a name too long, a payload that is not JSON) is an error in both cases, so a
mistake shows up the first time the code runs, not only on the bench.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from wattlab.acquisition.markers import gpu_marks
from wattlab.acquisition.markers.gpu_marks import Stamp
from wattlab.errors import UsageError
from wattlab.samples import Marker
from wattlab.sync.bus import BusPublisher

BUS_ENV = "WATTLAB_BUS"

_lock = threading.Lock()
_publishers: dict[int, BusPublisher] = {}
_exit_hook = False


def _at_exit() -> None:
    """Register ``_close_all`` once: publishers and the GPU marker queue both need it."""
    global _exit_hook  # noqa: PLW0603
    if not _exit_hook:
        _exit_hook = True
        atexit.register(_close_all)


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
            _at_exit()
        return pub


def _close_all() -> None:
    """Deliver queued markers before the interpreter exits (bounded by the linger time).

    GPU markers still waiting for their events go first: they need the bus open.
    """
    gpu_marks.close()
    with _lock:
        for pub in _publishers.values():
            pub.close()
        _publishers.clear()


def _send(marker: Marker) -> None:
    pub = _publisher()
    if pub is not None:
        pub.send_marker(marker)


def take_stamp(gpu: bool | None = None) -> Stamp:
    """The time of a boundary now: host time, and a GPU event where GPU time applies.

    Outside a session there is nothing to send, so no event is recorded either.
    """
    if not os.environ.get(BUS_ENV):
        return Stamp(time.monotonic_ns())
    resolver = gpu_marks.resolver(gpu, _send)
    if resolver is None:
        return Stamp(time.monotonic_ns())
    _at_exit()
    return resolver.stamp()


def mark(name: str, kind: str = "point", *, gpu: bool | None = None, at: Stamp | None = None,
         **payload: Any) -> None:
    """Record a named instant (``kind="point"``) or a phase boundary in the session's run.

    ``gpu``: None uses the GPU's execution time when this process runs CUDA through
    PyTorch, False keeps host time, True demands GPU time (see ``gpu_marks``). ``at``: a
    boundary taken earlier with ``take_stamp`` (a phase known to have begun only later).
    """
    stamp = at if at is not None else take_stamp(gpu)
    marker = Marker(stamp.host_ns, name, kind, f"pid{os.getpid()}", dict(payload))
    if stamp.owner is None:
        _send(marker)
    else:
        stamp.owner.submit(marker, stamp)


def count(name: str, n: float = 1) -> None:
    """Count ``n`` units of work done now (tokens, requests, samples) under ``name``.

    The analysis sums a name's counts into a cumulative counter (``wattlab energy --per``).
    Host time only: a count says when the program saw the work finish, not a GPU edge.
    """
    if isinstance(n, bool) or not isinstance(n, int | float) or not math.isfinite(n) or n < 0:
        raise UsageError(f"wattlab.count({name!r}, n={n!r}): n must be a finite number >= 0")
    mark(name, "count", gpu=False, n=n)


@contextmanager
def phase(name: str, *, gpu: bool | None = None, **payload: Any) -> Iterator[None]:
    """Mark the beginning and end of a phase (the end is marked even if the body raises).

    ``gpu`` as for ``mark``: in a CUDA program the phase spans the GPU's execution of the
    work queued inside it, not the host's queueing of it.
    """
    mark(name, "begin", gpu=gpu, **payload)
    try:
        yield
    finally:
        mark(name, "end", gpu=gpu)
