"""Each stream's batches and gaps in sequence order, and the resync after a recorder restart.

Why apart from the router: whatever socket a batch came in on, it is taken in sequence
order, every hole becomes a gap, duplicates are counted, batches of an undescribed stream
wait for its descriptor, and a stream resumed after a crash holds what comes ahead of the
hole until its publisher resends the rest (or the wait is given up and the hole is a gap).
"""

from __future__ import annotations

import time
from typing import Any

from wattlab.errors import MalformedMessageError
from wattlab.samples import Gap, Marker, SampleBatch, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.recorder.admission.limits import MAX_ORPHAN_BYTES, MAX_ORPHAN_STREAMS
from wattlab.sync.recorder.admission.refusals import Refusals
from wattlab.sync.recorder.flushing import Flusher
from wattlab.sync.recorder.gap_book import GapBook
from wattlab.sync.recorder.remote_clocks import RemoteClocks
from wattlab.sync.recorder.sockets import RecorderSockets
from wattlab.sync.recorder.source_state import MAX_ANNOUNCED_SOURCES, SourceState, seq_of

MAX_ORPHAN_BATCHES = 1000
RESEND_TIMEOUT_S = 2.0  # a resumed source that does not resend in time: the hole is a gap
MAX_HELD_ROWS = 4_000_000


class StreamOrder:
    """Puts each stream's items in sequence and hands them to the flusher and the gap book."""

    def __init__(self, sources: dict[str, SourceState], gaps: GapBook, flusher: Flusher,
                 clocks: RemoteClocks, sockets: RecorderSockets, *, refusals: Refusals) -> None:
        self._sources = sources
        self._refusals = refusals
        self._orphan_bytes = 0
        self._gaps = gaps
        self._flusher = flusher
        self._clocks = clocks
        self._sockets = sockets
        self._orphans: dict[str, list[tuple[bytes, SampleBatch]]] = {}
        self.resyncing: set[str] = set()  # streams holding batches until a resend comes

    # ---- what arrives ---------------------------------------------------------------------
    def on_descriptor(self, identity: bytes, desc: SourceDescriptor, host: str | None) -> None:
        """A stream starts, or a restarted source carries on: acknowledge where it goes on.

        The batches that came before the descriptor are taken now.
        """
        state = self._sources.get(desc.source_id)
        if state is None:
            state = self._sources[desc.source_id] = SourceState(desc, host=host)
        if host is None:
            state.owner = identity  # a new stream, or an ended one a restarted source resumes
        elif state.ended:
            state.ended = False  # announced again: a restarted source carries on
            state.end_seq = None
            changed = sorted(k for k, v in desc.config.items()
                             if state.desc.config.get(k) != v)[:20]
            self._flusher.markers.append(Marker(time.monotonic_ns(), "source restarted",
                                                "point", desc.source_id,
                                                {"config_changed": changed}))
        self._sockets.reply(identity, ack=desc.source_id, next_seq=state.next_seq)
        for orphan_identity, batch in self._orphans.pop(desc.source_id, []):
            self._orphan_bytes -= batch_bytes(batch)
            if host is None and orphan_identity != identity:
                self._refuse_batch(orphan_identity, batch, "batch from a client that did not "
                                   "describe the stream")
                continue
            self.on_batch(orphan_identity, batch)

    def on_batch(self, identity: bytes, batch: SampleBatch) -> None:
        state = self._sources.get(batch.source_id)
        if state is None:
            self._keep_orphan(identity, batch)
            return
        width = len(state.desc.channels)
        if batch.values.shape[1] != width:
            self._gaps.add(Gap(batch.source_id, "malformed batch rejected: channel count",
                               batch.seq, batch.last_seq, samples_lost=batch.n))
            state.next_seq = max(state.next_seq, batch.last_seq + 1)
            raise MalformedMessageError(
                f"source {batch.source_id!r} sent {batch.values.shape[1]} channels, "
                f"descriptor has {width}"
            )
        state.identity = identity
        self._order(state, batch.seq, batch.last_seq, batch)

    def _keep_orphan(self, identity: bytes, batch: SampleBatch) -> None:
        """A batch of a stream not described yet waits for its descriptor, within bounds.

        Past ``MAX_ORPHAN_STREAMS`` streams, ``MAX_ORPHAN_BATCHES`` batches of one or
        ``MAX_ORPHAN_BYTES`` in all, it is refused: counted and summed into a gap row.
        """
        orphans = self._orphans.get(batch.source_id)
        nbytes = batch_bytes(batch)
        if orphans is None and len(self._orphans) >= MAX_ORPHAN_STREAMS:
            why = f"batch of an undescribed stream past the first {MAX_ORPHAN_STREAMS}"
        elif orphans is not None and len(orphans) >= MAX_ORPHAN_BATCHES:
            why = f"batch of an undescribed stream past its first {MAX_ORPHAN_BATCHES}"
        elif self._orphan_bytes + nbytes > MAX_ORPHAN_BYTES:
            why = f"batch of an undescribed stream past {MAX_ORPHAN_BYTES >> 20} MiB held"
        else:
            if orphans is None:
                orphans = self._orphans[batch.source_id] = []
                self._sockets.reply(identity, describe=batch.source_id)
            orphans.append((identity, batch))
            self._orphan_bytes += nbytes
            return
        self._refuse_batch(identity, batch, why)

    def _refuse_batch(self, identity: bytes, batch: SampleBatch, why: str) -> None:
        self._refusals.note("batch(es) for streams over the limits or of other clients",
                            identity, f"{why} ({batch.source_id!r})")
        self._refusals.drop_rows(batch.source_id, why, batch.n)

    def on_gap(self, gap: Gap, identity: bytes | None = None) -> None:
        state = self._sources.get(gap.source)
        if state is not None and identity is not None:
            state.identity = identity
        if state is not None and 0 <= gap.seq_first <= gap.seq_last:
            self._order(state, gap.seq_first, gap.seq_last, gap)  # it stands for those batches
            return
        self._gaps.count(gap, state)

    def on_end(self, source_id: str, last_seq: Any) -> None:
        state = self._sources.get(source_id)
        if state is None:
            raise MalformedMessageError(f"end from unknown source {source_id!r}")
        if state.held and isinstance(last_seq, int):
            state.end_seq = last_seq  # resent batches may still come after the end
            return
        if isinstance(last_seq, int) and last_seq >= state.next_seq:
            self._gaps.hole(state, state.next_seq, last_seq, -1, "lost before the end")
            state.next_seq = last_seq + 1
        state.ended = True
        state.progress_dirty = True
        self._flusher.flush()  # the publisher waits for "on disk" before it closes

    def on_source_lost(self, head: dict[str, Any]) -> None:
        """The supervisor saw a source process die: say so in /gaps and stop waiting for it."""
        source_id = head.get("source_id")
        state = self._sources.get(source_id) if isinstance(source_id, str) else None
        if state is None:
            raise MalformedMessageError(f"source_lost for unknown source {source_id!r}")
        self._gaps.lost(state, str(head.get("reason", "source lost"))[:128])
        state.held, state.held_rows, state.resync = [], 0, False
        self.resyncing.discard(state.desc.source_id)
        state.ended = True
        state.progress_dirty = True

    def on_hello(self, identity: bytes, head: dict[str, Any], host: str | None) -> None:
        """A publisher names its streams (it stalled): a resumed stream asks it to resend."""
        sources = head.get("sources")
        if not isinstance(sources, list) or len(sources) > MAX_ANNOUNCED_SOURCES:
            raise MalformedMessageError("hello needs a list of at most 1000 stream names")
        for source_id in sources:
            state = self._sources.get(source_id) if isinstance(source_id, str) else None
            if state is None or state.host != host or not state.resync or state.held:
                continue
            if host is None and state.owner not in (None, identity):
                continue  # another client's stream
            state.identity = identity
            self._sockets.send_to(state, message.encode_reply(resend=source_id,
                                                              from_seq=state.next_seq))

    # ---- sequence order -------------------------------------------------------------------
    def _order(self, state: SourceState, seq: int, last_seq: int,
               item: SampleBatch | Gap) -> None:
        """Take a batch (or a gap covering sequence numbers) in sequence order."""
        if last_seq < state.next_seq:
            if isinstance(item, SampleBatch):
                state.duplicates += 1
                if not state.resumed and item.n:  # a resend after a restart may repeat
                    self._refusals.drop_rows(state.desc.source_id,
                                             "batch with sequence numbers already taken",
                                             item.n)
            return
        if seq > state.next_seq and state.resync:
            self._hold(state, item)
            return
        if seq > state.next_seq:
            reason = "sent before the recorder joined" if state.batches == 0 else "sequence gap"
            t_next = self._first_time(state, item)
            self._gaps.hole(state, state.next_seq, seq - 1, t_next, reason)
        state.next_seq = last_seq + 1
        self._accept(state, item)
        if state.held:
            self._release(state)
        if not state.held and state.resync:
            self._settled(state)

    def _accept(self, state: SourceState, item: SampleBatch | Gap) -> None:
        """The next item in sequence: rows to write, or a gap that stands for batches."""
        if isinstance(item, SampleBatch):
            self._flusher.take_rows(state, item,
                                    self._clocks.local_times_ns(state.host, item.t_host_ns))
        else:
            self._gaps.count(item, state)

    def _first_time(self, state: SourceState, item: SampleBatch | Gap) -> int:
        if isinstance(item, Gap):
            return item.t_first_ns
        if item.n == 0:
            return -1
        return int(self._clocks.local_times_ns(state.host, item.t_host_ns[:1])[0])

    # ---- after a recorder restart ---------------------------------------------------------
    def _hold(self, state: SourceState, item: SampleBatch | Gap) -> None:
        """Keep a batch that came ahead of what the crashed recorder lost; ask for the rest."""
        if not state.held and state.identity is not None:
            self._sockets.send_to(state, message.encode_reply(resend=state.desc.source_id,
                                                              from_seq=state.next_seq))
            state.resend_deadline_s = time.monotonic() + RESEND_TIMEOUT_S
        state.held.append(item)
        state.held_rows += item.n if isinstance(item, SampleBatch) else 0
        self.resyncing.add(state.desc.source_id)
        if state.held_rows > MAX_HELD_ROWS:
            self._give_up_resync(state)

    def _release(self, state: SourceState) -> None:
        """Process held batches that are in order now (resent ones filled the hole)."""
        state.held.sort(key=seq_of)
        while state.held and seq_of(state.held[0]) <= state.next_seq:
            item = state.held.pop(0)
            state.held_rows -= item.n if isinstance(item, SampleBatch) else 0
            last = item.last_seq if isinstance(item, SampleBatch) else item.seq_last
            if last < state.next_seq:
                state.duplicates += isinstance(item, SampleBatch)
                continue
            state.next_seq = last + 1
            self._accept(state, item)

    def _settled(self, state: SourceState) -> None:
        state.resync = False
        self.resyncing.discard(state.desc.source_id)
        if state.end_seq is not None:
            end_seq, state.end_seq = state.end_seq, None
            self.on_end(state.desc.source_id, end_seq)

    def _give_up_resync(self, state: SourceState) -> None:
        """No resend came (publisher gone, or too much held): the hole is recorded as a gap."""
        state.resync = False
        held, state.held, state.held_rows = sorted(state.held, key=seq_of), [], 0
        for item in held:
            if isinstance(item, SampleBatch):
                self._order(state, item.seq, item.last_seq, item)
            else:
                self._order(state, item.seq_first, item.seq_last, item)
        self._settled(state)

    def check_resync(self) -> None:
        """Give up on the streams whose resend is overdue."""
        now_s = time.monotonic()
        for source_id in list(self.resyncing):
            state = self._sources[source_id]
            if state.held and now_s >= state.resend_deadline_s:
                self._give_up_resync(state)

    # ---- at close -------------------------------------------------------------------------
    def give_up_all(self) -> None:
        """No more resends will come: every hole still waiting is a gap."""
        for source_id in list(self.resyncing):
            self._give_up_resync(self._sources[source_id])

    def finish(self) -> None:
        """Gaps for the streams that did not end and the batches never described."""
        for state in self._sources.values():
            if not state.ended:
                self._gaps.hole(state, state.next_seq, -1, -1, "source did not end cleanly")
        for source_id, orphans in self._orphans.items():
            self._gaps.add(Gap(source_id, "never described; batches dropped",
                               samples_lost=sum(b.n for _, b in orphans)))


def batch_bytes(batch: SampleBatch) -> int:
    """What a held batch costs in memory (its arrays)."""
    extra = sum(a.nbytes for a in (batch.t_raw, batch.flags) if a is not None)
    return int(batch.t_host_ns.nbytes + batch.values.nbytes + extra)
