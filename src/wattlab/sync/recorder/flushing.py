"""Getting rows onto disk, durably, and saying so.

The run file is opened with its reserve beside it; rows wait per stream and are written in
large slices; each flush writes them, the markers, the gaps and the ``/progress`` rows, and
tells each publisher what is ``durable``.

Why apart from the router: what is on disk, what the ``/progress`` table vouches for and
what each publisher may forget are one contract (docs/reliability.md); keeping the pending
rows, the markers, the flush and the ``durable`` answers together keeps it in one place.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.errors import MalformedMessageError, UsageError, WattlabError
from wattlab.runfile import ResumePoint, RunFileWriter, unreadable_gaps
from wattlab.samples import Marker, SampleBatch, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.recorder.admission.ingest_flags import flag_suspect_rows
from wattlab.sync.recorder.config import RecorderConfig
from wattlab.sync.recorder.disk_full import disk_full_error, free_reserve, make_reserve
from wattlab.sync.recorder.gap_book import GapBook
from wattlab.sync.recorder.remote_clocks import Remaps, SyncTables
from wattlab.sync.recorder.sockets import RecorderSockets
from wattlab.sync.recorder.source_state import SourceState
from wattlab.sync.recorder.stream_metrics import StreamMetrics

COALESCE_ROWS = 65536
FLUSH_BYTES = 8 * 1024 * 1024  # flush early past this much, so replay windows keep moving
# news after a quiet spell waits this long for the rest of its burst: a source's messages of
# one emit (the NVML reader sends up to four at once) then cost one flush, not one at once
# and another a flush interval later (issue 39); a crash can lose 20 ms more, no more
GATHER_S = 0.02


def open_run_file(config: RecorderConfig) -> tuple[RunFileWriter, dict[str, ResumePoint]]:
    """The run file, new or (``resume``) a crashed recorder's, with its reserve set aside."""
    points: dict[str, ResumePoint] = {}
    if config.resume:
        writer, points = RunFileWriter.resume(config.output, config.session_start_ns)
        if lost := unreadable_gaps(writer, "the recorder died"):
            writer.add_gaps(lost)
    else:
        writer = RunFileWriter(config.output, config.root_attrs, config.session_start_ns)
    _set_reserve_aside(writer, config)
    return writer, points


def _set_reserve_aside(writer: RunFileWriter, config: RecorderConfig) -> None:
    """Room to finish the file if the disk fills (see wattlab.sync.recorder.disk_full)."""
    try:
        make_reserve(config.output)
    except OSError as e:
        if config.resume:  # carry on: a full disk then ends without the /gaps row
            print(f"wattlab recorder: no reserve beside {config.output}: {e}", file=sys.stderr)
            return
        writer.close(fit_device_clocks=False)
        os.unlink(config.output)  # just created, holds nothing: never half a run
        raise UsageError(f"{config.output}: no room for the "
                         f"{os.path.basename(config.output)} reserve: {e}") from e


class Flusher:
    """Each stream's rows until the next flush; the flush; the close of the file."""

    def __init__(self, writer: RunFileWriter, config: RecorderConfig, *,
                 sources: dict[str, SourceState], gaps: GapBook, sockets: RecorderSockets,
                 metrics: StreamMetrics | None) -> None:
        self.writer = writer
        self._config = config
        self._sources = sources
        self._gaps = gaps
        self._sockets = sockets
        self._metrics = metrics
        self.markers: list[Marker] = []
        self.bytes_since_flush = 0
        self.new_objects = False  # a source added since the last flush
        self._started_s = time.monotonic()
        self._news_since_s: float | None = None  # when the loop first saw unflushed news

    def resume(self, points: dict[str, ResumePoint]) -> None:
        """Carry on a crashed recorder's file: every stream waits for its publisher's resend."""
        for source_id, point in points.items():
            desc = self.writer.descriptor(source_id)
            if self._metrics is not None:
                self._metrics.describe(desc)
            host = self.writer.remote_host(source_id) or None
            self._sources[source_id] = SourceState(
                desc, next_seq=point.seq_next, rows=point.rows, ended=point.ended, host=host,
                acked_seq=point.seq_next, resync=not point.ended, resumed=True)
        cut = sum(p.rows_dropped for p in points.values())
        self.markers.append(Marker(time.monotonic_ns(), "recorder restarted", "point",
                                   "recorder", {"rows_cut": cut}))
        self.writer.start_swmr()

    def add_source(self, desc: SourceDescriptor, host: str | None) -> None:
        """A stream's place in the file (a new one waits for the next flush's reopen)."""
        try:
            self.writer.add_source(desc, remote_host=host or "")
        except WattlabError as e:
            if disk_full_error(e):
                raise  # not the message's fault: the recording stops
            raise MalformedMessageError(str(e)) from e
        self.new_objects = True
        if self._metrics is not None:
            self._metrics.describe(desc)

    # ---- rows -----------------------------------------------------------------------------
    def take_rows(self, state: SourceState, batch: SampleBatch,
                  t_local_ns: npt.NDArray[np.int64]) -> None:
        """A batch in sequence, its times on this host's clock: held until the next write."""
        sender = batch.t_host_ns if state.host is not None else None
        state.batches += 1
        if batch.n == 0:
            return
        t_raw = batch.t_raw if batch.t_raw is not None else batch.t_host_ns
        flags = flag_suspect_rows(t_local_ns, batch.values, batch.flags,
                                  last_t_ns=state.last_t_ns, now_ns=time.monotonic_ns(),
                                  counts=state.flagged)
        state.pending.append((t_local_ns, t_raw, batch.values, flags, sender))
        state.pending_rows += batch.n
        state.rows += batch.n
        state.last_t_ns = int(t_local_ns[-1])
        if state.pending_rows >= COALESCE_ROWS:
            self._write_pending(state)

    def _write_pending(self, state: SourceState) -> None:
        if not state.pending:
            return
        parts = state.pending
        state.pending = []
        state.pending_rows = 0

        def cat(i: int) -> npt.NDArray[Any]:
            return parts[0][i] if len(parts) == 1 else np.concatenate([p[i] for p in parts])

        sender = cat(4) if state.host is not None else None
        values = cat(2)
        if self._metrics is not None:
            self._feed_metrics(self._metrics, state, cat(0), values, sender)
        if self._config.test_write_delay_s > 0:
            time.sleep(self._config.test_write_delay_s)
        self.writer.append(state.desc.source_id, cat(0), cat(1), values, cat(3),
                           t_sender_ns=sender)
        self.bytes_since_flush += values.nbytes
        state.progress_dirty = True

    @staticmethod
    def _feed_metrics(metrics: StreamMetrics, state: SourceState, t_ns: npt.NDArray[np.int64],
                      values: npt.NDArray[Any], sender: npt.NDArray[np.int64] | None) -> None:
        metrics.add_rows(state.desc.source_id, t_ns, values)
        if sender is not None and state.host is not None and len(t_ns):
            metrics.set_clock_offset(state.host, float(sender[-1] - t_ns[-1]))

    # ---- flushing -------------------------------------------------------------------------
    def has_news(self) -> bool:
        """Whether anything is not flushed yet: rows, markers, gaps, progress, new streams."""
        return (self.new_objects or bool(self.markers or self._gaps.pending)
                or any(s.pending or s.progress_dirty for s in self._sources.values()))

    def unflushed(self) -> bool:
        """Whether a flush has work: news, or SWMR still to start."""
        return self.has_news() or not self.writer.swmr

    def due(self, now_s: float, last_flush_s: float) -> bool:
        """Whether the loop flushes now.

        Yes when ``FLUSH_BYTES`` wait, or when the interval is over and the news has had
        ``GATHER_S`` for the rest of its burst (the loop asks after every wake, so the
        first ask after news arrived dates it).
        """
        if self.bytes_since_flush >= FLUSH_BYTES:
            return True
        if not self.unflushed():
            self._news_since_s = None
            return False
        if self._news_since_s is None:
            self._news_since_s = now_s
        return now_s >= self.flush_at_s(last_flush_s)

    def flush_at_s(self, last_flush_s: float) -> float:
        """When the news waiting now is to be flushed (the loop sleeps until then)."""
        since_s = time.monotonic() if self._news_since_s is None else self._news_since_s
        return max(last_flush_s + self._config.flush_interval_s, since_s + GATHER_S)

    def flush(self) -> None:
        """Write everything pending, say in /progress how far each source is, confirm it."""
        news = self.has_news()
        self._news_since_s = None
        for state in self._sources.values():
            self._write_pending(state)
        # a /progress row vouches for rows: a full disk must fail before it is written
        self.writer.flush_rows()
        if self.markers:
            if self._metrics is not None:
                self._metrics.add_markers(self.markers)
            self.writer.add_markers(self.markers)
            self.markers = []
        if self._gaps.pending:
            self.writer.add_gaps(self._gaps.pending)
            self._gaps.pending = []
        dirty = [s for s in self._sources.values() if s.progress_dirty]
        if self._metrics is not None:
            for state in self._sources.values():
                self._metrics.set_gaps(state.desc.source_id, state.gaps)
        if dirty:
            self.writer.add_progress([(s.desc.source_id, s.next_seq, s.rows, s.ended)
                                      for s in dirty])
        if (not self.writer.swmr
                and time.monotonic() - self._started_s > self._config.swmr_after_s):
            self.writer.start_swmr()
        elif not news:
            return  # nothing new: an HDF5 flush costs CPU even then
        self.new_objects = False
        self.writer.flush()
        self.bytes_since_flush = 0
        for state in dirty:
            state.progress_dirty = False
            if state.identity is not None and state.next_seq > state.acked_seq:
                state.acked_seq = state.next_seq
                self._sockets.send_to(state, message.encode_reply(
                    durable=state.desc.source_id, seq_next=state.next_seq))

    def close(self, final_attrs: dict[str, Any], sync: SyncTables, remaps: Remaps) -> None:
        """Close the file (final attributes, clock tables, re-timed remote streams)."""
        self.writer.close(final_attrs, sync=sync, remaps=remaps)
        free_reserve(self._config.output)
