"""A publisher's messages waiting to be sent, and the pump that sends them in order.

Why apart from the publisher: what may leave now depends on the replay window (room for
another batch), the pipe (full in backlog mode), and the backlog bound (beyond it whole
batches are dropped and one gap message says exactly what was lost); keeping the queue,
the drops and the pump together keeps that order in one place.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from wattlab.errors import BusError
from wattlab.samples import Gap, SampleBatch
from wattlab.sync.bus import message
from wattlab.sync.bus.dealer import DealerSocket
from wattlab.sync.bus.replay_window import BACKLOG_DROP_REASON, ReplayWindow, SentBatch

# no durable ack for this long while the window is full: say hello (a restarted recorder
# learns who has its streams, and asks for what it lacks)
STALL_HELLO_S = 1.0


@dataclass
class DroppedRun:
    """Consecutive batches dropped unsent (backlog full); leaves as one gap message."""

    source_id: str
    seq_first: int
    seq_last: int
    rows: int
    t_first_ns: int
    t_last_ns: int


class Outbox:
    """Messages not sent yet, in order: batches, runs of dropped batches, other frames."""

    def __init__(self, socket: DealerSocket, window: ReplayWindow, backlog_bytes: int | None,
                 serve_requests: Callable[[], None]) -> None:
        """``backlog_bytes`` None: never drop, wait for the recorder (the socket blocks).

        ``serve_requests`` answers the recorder; the pump calls it before sending and while
        it waits for room in the window.
        """
        self._socket = socket
        self._window = window
        self._backlog_bytes = backlog_bytes or 0
        self._serve_requests = serve_requests
        self._items: deque[SentBatch | DroppedRun | list[Any]] = deque()
        self.queued_bytes = 0
        self.dropped_batches = 0
        self.dropped_rows = 0
        self._last_hello_s = 0.0

    def __bool__(self) -> bool:
        """Whether anything waits to be sent."""
        return bool(self._items)

    def queue(self, frames: list[Any]) -> None:
        """A message other than a batch, after everything queued."""
        self._items.append(frames)

    def push_front(self, frames: list[Any]) -> None:
        """A message the recorder asked for: it leaves before everything queued."""
        self._items.appendleft(frames)

    def queue_batch(self, batch: SampleBatch) -> None:
        stream = self._window.stream(batch.source_id)
        stream.next_seq = max(stream.next_seq, batch.last_seq + 1)
        tail = self._items[-1] if self._items else None
        if isinstance(tail, DroppedRun) and tail.source_id == batch.source_id:
            self._drop(batch, tail)  # once dropping, keep the loss contiguous until it drains
            return
        frames = message.encode_batch(batch)
        nbytes = sum(_nbytes(f) for f in frames)
        if (not self._socket.blocking and self._items
                and self.queued_bytes + nbytes > self._backlog_bytes):
            self._drop(batch, None)
            return
        self._items.append(SentBatch(batch.source_id, batch.seq, batch.last_seq, batch.n,
                                     nbytes, frames))
        self.queued_bytes += nbytes

    def _drop(self, batch: SampleBatch, into: DroppedRun | None) -> None:
        """Account for a batch that cannot be kept: exact sequence range and row count."""
        self.dropped_batches += 1
        self.dropped_rows += batch.n
        t_first = int(batch.t_host_ns[0]) if batch.n else -1
        t_last = int(batch.t_host_ns[-1]) if batch.n else -1
        if into is None:
            self._items.append(DroppedRun(batch.source_id, batch.seq, batch.last_seq, batch.n,
                                          t_first, t_last))
        else:
            into.seq_last = batch.last_seq
            into.rows += batch.n
            into.t_last_ns = t_last if t_last >= 0 else into.t_last_ns
        self._window.record_drop(batch.source_id, batch.seq, batch.last_seq, batch.n)

    def first_queued_seq(self, source_id: str) -> int | None:
        """The first sequence number of ``source_id`` still waiting here (None: none)."""
        for item in self._items:
            if isinstance(item, SentBatch) and item.source_id == source_id:
                return item.seq
            if isinstance(item, DroppedRun) and item.source_id == source_id:
                return item.seq_first
        return None

    def pump(self) -> None:
        """Send what the window and the pipe allow, in order."""
        self._serve_requests()
        while self._items:
            item = self._items[0]
            if isinstance(item, SentBatch):
                if self._window.full_for(item.nbytes):
                    if not self._socket.blocking:
                        self._hello_if_stalled()
                        return
                    self._wait_for_window(item.nbytes)
                    continue
                if not self._socket.try_send(item.frames):
                    return
                self._window.add(item)
                self.queued_bytes -= item.nbytes
            else:
                frames = _drop_frames(item) if isinstance(item, DroppedRun) else item
                if not self._socket.try_send(frames):
                    return
            self._items.popleft()

    def drain(self, deadline_s: float) -> bool:
        """Send everything queued (blocking up to ``deadline_s``); False if it could not."""
        while self._items:
            if time.monotonic() >= deadline_s:
                return False
            self.pump()
            if self._items:
                self._socket.poll(20, zmq.POLLIN | zmq.POLLOUT)
        return True

    def _wait_for_window(self, nbytes: int) -> None:
        """Blocking mode: wait for durable acks (the recorder flushes at least every 0.5 s)."""
        timeout_ms = self._socket.send_timeout_ms
        deadline_s = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        while self._window.full_for(nbytes):
            self._hello_if_stalled()
            if deadline_s is not None and time.monotonic() > deadline_s:
                raise BusError(f"bus to {self._socket.endpoint}: recorder confirmed nothing for "
                               f"{timeout_ms} ms; is it there?")
            if self._socket.poll(100):
                self._serve_requests()

    def _hello_if_stalled(self) -> None:
        """Say hello when the window is full and nothing was confirmed for a while.

        A recorder restarted after a crash knows the streams (from the file) but not which
        peer sends them, and a publisher whose window is full sends no batch it could learn
        that from; the hello names this publisher's streams so it can ask for a resend.
        """
        now_s = time.monotonic()
        if (now_s - self._window.last_progress_s < STALL_HELLO_S
                or now_s - self._last_hello_s < STALL_HELLO_S):
            return
        self._last_hello_s = now_s
        # pipe full too: the next check tries again
        self._socket.send_if_room(message.encode_control("hello",
                                                         sources=sorted(self._window.streams)))


def _drop_frames(drop: DroppedRun) -> list[Any]:
    return message.encode_gap(Gap(drop.source_id, BACKLOG_DROP_REASON, drop.seq_first,
                                  drop.seq_last, drop.t_first_ns, drop.t_last_ns, drop.rows))


def _nbytes(frame: Any) -> int:
    if isinstance(frame, np.ndarray):
        return int(frame.nbytes)
    return len(frame)
