"""The GPU's execution time of a point in its queued work, on the host's monotonic clock.

Why: a framework callback runs when the host has *queued* a step's kernels, often long
before the GPU runs them, so a marker stamped with host time misses the step's energy.
A CUDA event recorded on the current stream at the boundary completes when the GPU gets
there. Events only measure time between events, so the clock pairs a reference event with
host time: it records one on an idle side stream and waits for it, reading the host clock
just before the record and just after the wait; the event's time lies between the two, so
their midpoint is the pairing and half their distance its uncertainty. Pairings are
refreshed (``refresh``, off the training path) so drift between the two clocks stays small
and elapsed times stay short (CUDA reports them as 32-bit floats in ms).

The CUDA calls sit behind ``EventBackend`` so the rest runs, and is tested, without a GPU
(``wattlab.hardware.fake_cuda_events``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

PAIRING_TRIES = 5  # at start: the narrowest of these is kept
PAIRINGS_KEPT = 8
EVENT_RESOLUTION_NS = 500  # CUDA's event timer resolution (~0.5 µs)
FLOAT32_REL = 6e-8  # CUDA reports elapsed times as float32 ms: ~6e-8 of the value


class EventBackend(Protocol):
    """The few CUDA event operations GPU markers need."""

    def record(self) -> Any:
        """Record an event on the current stream (no wait); None if it cannot be timed."""

    def done(self, event: Any) -> bool:
        """Whether the GPU has executed the event (never waits)."""

    def wait(self, event: Any) -> None:
        """Block this thread until the event has executed (sleeping, not spinning)."""

    def elapsed_ns(self, start: Any, end: Any) -> float:
        """GPU time from ``start`` to ``end`` (both executed), ns; negative if end is first."""

    def pair(self) -> tuple[Any, int, int]:
        """Record an event on an idle side stream and wait for it.

        Returns (event, host ns before the record, host ns after the wait).
        """


@dataclass(frozen=True)
class Pairing:
    """A reference event whose GPU time is ``host_ns`` ± ``half_width_ns`` on the host clock."""

    event: Any
    host_ns: int
    half_width_ns: int
    taken_after_ns: int  # host time when the pairing was known (events recorded later use it)


class GpuClock:
    """Maps executed events to host time through the latest pairing before each event."""

    def __init__(self, backend: EventBackend, tries: int = PAIRING_TRIES) -> None:
        self.backend = backend
        self.pairings: list[Pairing] = []
        # host ns per GPU ns, minus one, between the first and the latest pairing (the
        # longest baseline: two pairings 1 s apart would know it to ~1e-4 only)
        self.drift: float = 0.0
        self.drift_uncertainty: float = 0.0
        self.first = self.refresh(tries)

    def refresh(self, tries: int = 1) -> Pairing:
        """Take a new pairing (the narrowest of ``tries``); call it off the training path."""
        best: Pairing | None = None
        for _ in range(max(1, tries)):
            event, before, after = self.backend.pair()
            p = Pairing(event, (before + after) // 2, (after - before + 1) // 2, after)
            if best is None or p.half_width_ns < best.half_width_ns:
                best = p
        assert best is not None
        if self.pairings:
            first = self.first
            gpu_ns = self.backend.elapsed_ns(first.event, best.event)
            if gpu_ns > 0:
                self.drift = (best.host_ns - first.host_ns) / gpu_ns - 1.0
                self.drift_uncertainty = (best.half_width_ns + first.half_width_ns
                                          + 2 * EVENT_RESOLUTION_NS) / gpu_ns
        self.pairings = [*self.pairings[-(PAIRINGS_KEPT - 1):], best]
        return best

    def age_ns(self) -> int:
        return time.monotonic_ns() - self.pairings[-1].taken_after_ns

    def to_host(self, event: Any, recorded_ns: int) -> tuple[int, int]:
        """(host-clock ns when the GPU executed ``event``, half-width ns).

        ``recorded_ns`` is when the host recorded it: the pairing used is the latest one
        known by then, so its event ran before this one and the elapsed time is positive.
        """
        usable = [p for p in self.pairings if p.taken_after_ns <= recorded_ns]
        p = usable[-1] if usable else self.pairings[0]
        gpu_ns = self.backend.elapsed_ns(p.event, event)
        t_ns = p.host_ns + round(gpu_ns * (1.0 + self.drift))
        unc = (p.half_width_ns + EVENT_RESOLUTION_NS
               + abs(gpu_ns) * (self.drift_uncertainty + FLOAT32_REL))
        return t_ns, round(unc)


class TorchCudaEvents:
    """``EventBackend`` on PyTorch's CUDA events, on the device current at creation.

    Marker events are created with ``blocking=True`` so a thread waiting on one sleeps
    instead of spinning a CPU core; pairing events spin, which keeps the pairing tight.
    The side stream comes from PyTorch's pool (non-blocking): the default stream's queue
    does not hold the pairing event back.
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.device = torch.cuda.current_device()
        self._side = torch.cuda.Stream(device=self.device)

    def record(self) -> Any:
        cuda = self._torch.cuda
        if cuda.current_device() != self.device:  # another GPU: its clock is not paired
            return None
        event = cuda.Event(enable_timing=True, blocking=True)
        event.record()
        return event

    def done(self, event: Any) -> bool:
        return bool(event.query())

    def wait(self, event: Any) -> None:
        event.synchronize()

    def elapsed_ns(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) * 1e6

    def pair(self) -> tuple[Any, int, int]:
        cuda = self._torch.cuda
        event = cuda.Event(enable_timing=True)
        with cuda.device(self.device):
            before = time.monotonic_ns()
            event.record(self._side)
            event.synchronize()
            after = time.monotonic_ns()
        return event, before, after
