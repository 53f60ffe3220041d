"""Joining consecutive batches of one source into one, before they go on the bus.

Why in the publisher: the recorder pays ~40 µs of Python per message whatever its size,
and it is one process for every source; merging a source's back-to-back batches in the
source's own process moves that work to another core and cuts the recorder's message
count by up to ``max_rows / rows per batch``. Merged batches keep their sequence range
(``seq`` .. ``seq_last``) so the recorder still sees every gap.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wattlab.samples import SampleBatch


def joinable(a: SampleBatch, b: SampleBatch) -> bool:
    """``b`` directly follows ``a`` and has the same columns, dtypes and optional arrays."""
    return (
        b.seq == a.last_seq + 1
        and a.values.shape[1] == b.values.shape[1]
        and a.values.dtype == b.values.dtype
        and (a.t_raw is None) == (b.t_raw is None)
        and (a.t_raw is None or b.t_raw is None or a.t_raw.dtype == b.t_raw.dtype)
        and (a.flags is None) == (b.flags is None)
    )


def join(batches: list[SampleBatch]) -> SampleBatch:
    """One batch holding ``batches`` (which must be joinable in order)."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0]

    def cat(arrays: list[Any]) -> Any:
        return np.concatenate(arrays)

    return SampleBatch(
        first.source_id, first.seq,
        cat([b.t_host_ns for b in batches]),
        cat([b.values for b in batches]),
        None if first.t_raw is None else cat([b.t_raw for b in batches]),
        None if first.flags is None else cat([b.flags for b in batches]),
        seq_last=batches[-1].last_seq,
    )


class Coalescer:
    """Holds back consecutive batches per source until ``max_rows`` or a flush."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._pending: dict[str, list[SampleBatch]] = {}
        self._rows: dict[str, int] = {}

    def add(self, batch: SampleBatch) -> list[SampleBatch]:
        """Take a batch; return whatever is ready to send now (possibly nothing)."""
        out: list[SampleBatch] = []
        held = self._pending.get(batch.source_id)
        if held and not joinable(held[-1], batch):
            out.append(self._take(batch.source_id))
            held = None
        if held is None:
            self._pending[batch.source_id] = [batch]
            self._rows[batch.source_id] = batch.n
        else:
            held.append(batch)
            self._rows[batch.source_id] += batch.n
        if self._rows[batch.source_id] >= self.max_rows:
            out.append(self._take(batch.source_id))
        return out

    def _take(self, source_id: str) -> SampleBatch:
        self._rows.pop(source_id, None)
        return join(self._pending.pop(source_id))

    @property
    def pending(self) -> bool:
        """Whether any batch is held back."""
        return bool(self._pending)

    def take_all(self) -> list[SampleBatch]:
        return [self._take(source_id) for source_id in list(self._pending)]
