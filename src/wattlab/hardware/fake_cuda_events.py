"""A stand-in for CUDA events where no GPU is present: a GPU running behind the host.

It models what GPU markers depend on: one stream whose work is queued by the host and
executed later (``launch`` queues a kernel of a given length; an event recorded after it
executes when the kernels before it are done), a GPU timer with its own offset and rate
(``drift_ppm``) that only elapsed times reveal, an idle side stream for pairings that
executes after ``pair_latency_ns``, and a host that wakes ``wake_ns`` after the event.
Every event keeps its true execution time on the host clock (``true_host_ns``) so tests
can check what the pairing recovers.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

EVENT_TICK_NS = 500  # CUDA's event timer counts in ~0.5 µs steps


@dataclass(frozen=True)
class FakeEvent:
    """One recorded event: when it executes (host clock) and what the GPU timer reads then."""

    true_host_ns: int
    gpu_timer_ns: int


class FakeCudaEvents:
    """``EventBackend`` of a simulated GPU (see module doc); thread-safe like CUDA's."""

    def __init__(self, *, offset_ns: int = 123_456_789_000, drift_ppm: float = 20.0,
                 pair_latency_ns: int = 15_000, wake_ns: int = 5_000,
                 min_queue_ns: int = 20_000) -> None:
        self.offset_ns = offset_ns
        self.rate = 1.0 + drift_ppm * 1e-6
        self.pair_latency_ns = pair_latency_ns
        self.wake_ns = wake_ns
        self.min_queue_ns = min_queue_ns
        self._busy_until_ns = 0
        self._lock = threading.Lock()
        self.records = 0

    def _timer(self, host_ns: int) -> int:
        raw = round(host_ns * self.rate) + self.offset_ns
        return raw - raw % EVENT_TICK_NS

    def launch(self, duration_ns: int) -> None:
        """Queue a kernel of ``duration_ns`` behind the stream's earlier work."""
        with self._lock:
            start = max(time.monotonic_ns() + self.min_queue_ns, self._busy_until_ns)
            self._busy_until_ns = start + duration_ns

    def busy_until_ns(self) -> int:
        """When the queued work will be done (host clock)."""
        return self._busy_until_ns

    def record(self) -> FakeEvent:
        with self._lock:
            self.records += 1
            at = max(time.monotonic_ns() + self.min_queue_ns, self._busy_until_ns)
            self._busy_until_ns = at
        return FakeEvent(at, self._timer(at))

    def done(self, event: FakeEvent) -> bool:
        return time.monotonic_ns() >= event.true_host_ns

    def wait(self, event: FakeEvent) -> None:
        left = event.true_host_ns + self.wake_ns - time.monotonic_ns()
        if left > 0:
            time.sleep(left / 1e9)

    def elapsed_ns(self, start: FakeEvent, end: FakeEvent) -> float:
        # CUDA hands back float32 milliseconds
        import numpy as np

        return float(np.float32((end.gpu_timer_ns - start.gpu_timer_ns) / 1e6)) * 1e6

    def pair(self) -> tuple[FakeEvent, int, int]:
        before = time.monotonic_ns()
        at = before + self.pair_latency_ns
        event = FakeEvent(at, self._timer(at))
        self.wait(event)
        return event, before, time.monotonic_ns()
