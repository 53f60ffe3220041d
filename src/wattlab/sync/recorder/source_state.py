"""What the recorder knows about one stream, in one place.

Why a module of its own: the router, the ordering, the flushing and the status all read and
update the same per-stream record; keeping it apart lets each of them import it without
importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wattlab.samples import Gap, SampleBatch, SourceDescriptor

MAX_ANNOUNCED_SOURCES = 1000  # stream names one hello may list


@dataclass
class SourceState:
    """One stream: how far it is, what waits to be written, what is held back."""

    desc: SourceDescriptor
    next_seq: int = 0
    rows: int = 0
    batches: int = 0
    gaps: int = 0
    samples_lost: int = 0
    duplicates: int = 0
    ended: bool = False
    last_t_ns: int = -1
    host: str | None = None  # remote host that owns the stream; None: this host
    pending: list[tuple[Any, Any, Any, Any, Any]] = field(default_factory=list)
    pending_rows: int = 0
    identity: bytes | None = None  # the publisher that last sent for this stream
    # the local client that described the stream: only its messages are taken for it
    # (None: not known yet, a stream resumed from a crashed recorder's file)
    owner: bytes | None = None
    resumed: bool = False  # carried on from a crashed recorder's file: resends may repeat
    flagged: dict[str, int] = field(default_factory=dict)  # rows flagged at ingest, by flag
    acked_seq: int = 0  # next_seq last confirmed to the publisher as on disk
    progress_dirty: bool = False
    resync: bool = False  # resumed after a crash: hold out-of-order batches, ask for resend
    resend_deadline_s: float = 0.0  # time.monotonic() at which a resend is given up
    held: list[SampleBatch | Gap] = field(default_factory=list)
    held_rows: int = 0
    end_seq: int | None = None  # "end" that came while batches were held


def seq_of(item: SampleBatch | Gap) -> int:
    """The first sequence number a batch or a gap stands for."""
    return item.seq if isinstance(item, SampleBatch) else item.seq_first

