"""Markers stamped with the GPU's execution time, resolved off the training path.

The calling thread only records a CUDA event and queues the marker (no synchronisation).
A resolver thread waits for each event in turn (sleeping, the GIL released), converts it
through the ``GpuClock`` pairing, refreshes the pairing about once a second, and sends the
marker with both times. At exit (or ``close``) what is still queued is resolved and sent.

When: ``wattlab.mark``/``phase`` use GPU time automatically once this process has
initialised CUDA through PyTorch (``gpu=None``): in such a program a boundary marked from
the host is when work was queued, not done. ``gpu=False`` keeps host time (a phase of host
work, such as data loading); ``gpu=True`` demands GPU time; ``WATTLAB_GPU_MARKERS=0`` turns
the automatic choice off. The host time is always kept as well.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from wattlab.acquisition.markers.gpu_timebase import EventBackend, GpuClock
from wattlab.errors import UsageError
from wattlab.samples import Marker

GPU_ENV = "WATTLAB_GPU_MARKERS"
REFRESH_S = 1.0
CLOSE_TIMEOUT_S = 30.0

Send = Callable[[Marker], None]


@dataclass
class Stamp:
    """A boundary as the host saw it, with the event the GPU will execute there (if any)."""

    host_ns: int
    event: Any = None
    owner: GpuMarkResolver | None = None  # the resolver whose clock times the event
    gpu_ns: int | None = None  # filled in by the resolver
    gpu_uncertainty_ns: int | None = None


class GpuMarkResolver:
    """Queues GPU-stamped markers and sends each once its event has executed."""

    def __init__(self, backend: EventBackend, send: Send, refresh_s: float = REFRESH_S) -> None:
        self.clock = GpuClock(backend)
        self.backend = backend
        self.pid = os.getpid()
        self._send = send
        self._refresh_ns = round(refresh_s * 1e9)
        self._queue: deque[tuple[Marker, Stamp]] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self.sent = 0
        self.most_pending = 0
        self._thread = threading.Thread(target=self._run, name="wattlab-gpu-markers",
                                        daemon=True)
        self._thread.start()

    def stamp(self) -> Stamp:
        """Host time now and an event on the current stream (the training path's only cost)."""
        host_ns = time.monotonic_ns()
        event = self.backend.record()
        return Stamp(host_ns, event, None if event is None else self)

    def submit(self, marker: Marker, stamp: Stamp) -> None:
        with self._cv:
            self._queue.append((marker, stamp))
            self.most_pending = max(self.most_pending, len(self._queue))
            self._cv.notify()

    def pending(self) -> int:
        """Markers queued or being resolved (not yet sent)."""
        with self._cv:
            return len(self._queue)

    def _resolve(self, stamp: Stamp) -> None:
        if stamp.gpu_ns is not None or stamp.event is None:
            return
        self.backend.wait(stamp.event)
        stamp.gpu_ns, stamp.gpu_uncertainty_ns = self.clock.to_host(stamp.event, stamp.host_ns)
        if self.clock.age_ns() > self._refresh_ns:
            self.clock.refresh()

    def _next(self) -> tuple[Marker, Stamp] | None:
        with self._cv:
            while not self._queue and not self._closing:
                self._cv.wait()
            return self._queue[0] if self._queue else None

    def _run(self) -> None:
        failed = False
        while (item := self._next()) is not None:
            marker, stamp = item
            try:
                self._resolve(stamp)  # outside the lock: submit never waits for the GPU
            except Exception as e:  # a CUDA error: the marker keeps its host time
                if not failed:
                    print(f"wattlab: GPU marker time unavailable ({type(e).__name__}: {e}); "
                          "markers keep host time", file=sys.stderr)
                failed = True
            with self._cv:
                self._queue.popleft()
            self._send(replace(marker, t_gpu_ns=stamp.gpu_ns,
                               gpu_uncertainty_ns=stamp.gpu_uncertainty_ns))
            self.sent += 1

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Send everything queued (waiting for the GPU up to ``timeout_s``), then stop."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            print(f"wattlab: {len(self._queue)} GPU marker(s) not resolved within "
                  f"{timeout_s:g} s; left out", file=sys.stderr)


_lock = threading.Lock()
_active: GpuMarkResolver | None = None


def install(backend: EventBackend, send: Send, refresh_s: float = REFRESH_S
            ) -> GpuMarkResolver:
    """Use ``backend`` for this process's GPU markers (the fake GPU in tests, benchmarks)."""
    global _active  # noqa: PLW0603
    with _lock:
        if _active is not None:
            _active.close()
        _active = GpuMarkResolver(backend, send, refresh_s)
        return _active


def _cuda_ready() -> bool:
    """Whether PyTorch is imported and has initialised CUDA (never imports torch)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return cuda is not None and bool(cuda.is_initialized())


def resolver(gpu: bool | None, send: Send) -> GpuMarkResolver | None:
    """The resolver to stamp with, or None for host time (see the module doc for when)."""
    global _active  # noqa: PLW0603
    if gpu is False:
        return None
    current = _active
    if current is not None and current.pid == os.getpid():
        return current
    if gpu is None and os.environ.get(GPU_ENV, "1") == "0":
        return None
    if not _cuda_ready():
        if gpu:
            raise UsageError("gpu=True: this process has not initialised CUDA through "
                             "PyTorch, so there is no GPU time to mark")
        return None
    from wattlab.acquisition.markers.gpu_timebase import TorchCudaEvents

    with _lock:
        if _active is None or _active.pid != os.getpid():  # a forked child starts afresh
            _active = GpuMarkResolver(TorchCudaEvents(), send)
        return _active


def close() -> None:
    """Resolve and send what is queued (at exit, before the bus closes)."""
    global _active
    with _lock:
        current, _active = _active, None
    if current is not None and current.pid == os.getpid():
        current.close()
