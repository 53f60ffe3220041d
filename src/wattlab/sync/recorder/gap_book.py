"""The /gaps rows waiting for the next flush, and the gap counts each stream reports.

Why one place: a hole is worded and counted the same way whether the recorder saw it in the
sequence numbers, a source reported it, or a stream was lost or never ended, so the file's
/gaps table and the ``status`` counts agree.
"""

from __future__ import annotations

import time

from wattlab.samples import Gap
from wattlab.sync.recorder.source_state import SourceState


class GapBook:
    """Gaps not written yet, in the order they were seen."""

    def __init__(self) -> None:
        self.pending: list[Gap] = []

    def add(self, gap: Gap) -> None:
        """A gap no stream counts (its stream is unknown, or the rows never reached it)."""
        self.pending.append(gap)

    def count(self, gap: Gap, state: SourceState | None) -> None:
        """A gap that stands for a stream's lost batches: counted with its lost samples."""
        self.pending.append(gap)
        if state is not None:
            state.gaps += 1
            state.samples_lost += max(gap.samples_lost, 0)

    def hole(self, state: SourceState, first_seq: int, last_seq: int, t_next_ns: int,
             reason: str) -> None:
        """Sequence numbers ``first_seq``..``last_seq`` never came (-1: up to the end)."""
        self.pending.append(Gap(state.desc.source_id, reason, first_seq, last_seq,
                                state.last_t_ns, t_next_ns))
        state.gaps += 1

    def lost(self, state: SourceState, reason: str) -> None:
        """The stream's source died: everything from its next sequence number on is gone."""
        self.pending.append(Gap(state.desc.source_id, reason, state.next_seq, -1,
                                state.last_t_ns, time.monotonic_ns()))
        state.gaps += 1
