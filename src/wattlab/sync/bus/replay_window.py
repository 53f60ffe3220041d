"""What a publisher keeps for a restarted recorder: batches sent but not yet on disk.

Why apart from the publisher: the window's bookkeeping (bytes held, what each ``durable``
answer frees, which ranges were dropped, what a ``resend`` must carry and what it must call
a gap) is one accounting that the sending side only consults.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wattlab.samples import Gap
from wattlab.sync.bus import message

BACKLOG_DROP_REASON = "dropped by the source: bus backlog full (recorder too slow or away)"


@dataclass
class SentBatch:
    """A batch on the wire but not yet on disk: kept so a restarted recorder can have it."""

    source_id: str
    seq: int
    last_seq: int
    rows: int
    nbytes: int
    frames: list[Any]


@dataclass
class StreamReplay:
    """A source's replay state in this publisher."""

    window: deque[SentBatch] = field(default_factory=deque)
    durable_next: int = 0
    next_seq: int = 0  # one past the last sequence number queued
    dropped: list[list[int]] = field(default_factory=list)  # [first, last, rows] not yet acked


class ReplayWindow:
    """Every stream's batches sent and not confirmed on disk, bounded by ``limit_bytes``."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = max(1, limit_bytes)
        self.streams: dict[str, StreamReplay] = {}
        self.used_bytes = 0
        self.resent_batches = 0
        self.last_progress_s = time.monotonic()  # the recorder last confirmed or asked

    def stream(self, source_id: str) -> StreamReplay:
        stream = self.streams.get(source_id)
        if stream is None:
            stream = self.streams[source_id] = StreamReplay()
        return stream

    def full_for(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more would overflow the window (an empty one takes anything)."""
        return bool(self.used_bytes) and self.used_bytes + nbytes > self.limit_bytes

    def add(self, sent: SentBatch) -> None:
        self.streams[sent.source_id].window.append(sent)
        self.used_bytes += sent.nbytes

    def record_drop(self, source_id: str, seq: int, last_seq: int, rows: int) -> None:
        """Batches dropped unsent: kept as exact ranges for a later resend's gap."""
        dropped = self.stream(source_id).dropped
        if dropped and dropped[-1][1] + 1 == seq:
            dropped[-1][1] = last_seq
            dropped[-1][2] += rows
        else:
            dropped.append([seq, last_seq, rows])

    def durable_seq(self, source_id: str) -> int:
        """The next sequence number of a stream not yet confirmed on disk by the recorder."""
        stream = self.streams.get(source_id)
        return 0 if stream is None else stream.durable_next

    def on_durable(self, source_id: str, seq_next: int) -> None:
        """The recorder has the stream on disk up to ``seq_next``: forget that much."""
        stream = self.streams.get(source_id)
        if stream is None:
            return
        self.last_progress_s = time.monotonic()
        stream.durable_next = max(stream.durable_next, seq_next)
        while stream.window and stream.window[0].last_seq < seq_next:
            self.used_bytes -= stream.window.popleft().nbytes
        stream.dropped = [d for d in stream.dropped if d[1] >= seq_next]

    def resend(self, source_id: str, from_seq: int,
               first_queued_seq: Callable[[str], int | None]) -> list[list[Any]]:
        """What a restarted recorder lacking ``from_seq`` onwards gets, in order.

        The batches still in the window, and what is gone for good (dropped, or older than
        the window) said exactly, as gaps. ``first_queued_seq``: the stream's first sequence
        number still waiting to be sent (None: nothing waits).
        """
        stream = self.streams.get(source_id)
        if stream is None:
            return []
        again = [e for e in stream.window if e.last_seq >= from_seq]
        if again:
            ends = [again[0].seq] + [e.seq for e in again[1:]]
        else:
            first = first_queued_seq(source_id)
            ends = [stream.next_seq if first is None else first]
        front: list[list[Any]] = []
        expected = from_seq
        for i, upto in enumerate(ends):
            if upto > expected:  # a hole: dropped (gap message lost with the recorder) or gone
                front.append(self._hole(source_id, stream, expected, upto - 1))
            if i < len(again):
                front.append(again[i].frames)
                expected = max(expected, again[i].last_seq + 1)
        self.resent_batches += len(again)
        self.last_progress_s = time.monotonic()
        return front

    @staticmethod
    def _hole(source_id: str, stream: StreamReplay, first: int, last: int) -> list[Any]:
        """A gap message for sequence numbers no longer here, exact where they were dropped."""
        lost = [d for d in stream.dropped if d[0] >= first and d[1] <= last]
        covered = sum(d[1] - d[0] + 1 for d in lost) == last - first + 1
        rows = sum(d[2] for d in lost) if covered else -1
        reason = (BACKLOG_DROP_REASON if covered
                  else "lost in a recorder restart (not in the replay window)")
        return message.encode_gap(Gap(source_id, reason, first, last, samples_lost=rows))
