"""Run an acquirer (a driver wrapped to yield samples) and publish what it reads.

An *acquirer* knows an instrument; the *runner* knows the bus: it numbers batches per
source, announces descriptors, and says "end" when the source stops, so the recorder can
tell a clean stop from lost data.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from wattlab.acquisition.acquirers import Acquirer, Chunk, Flushable, Reading
from wattlab.errors import WattlabError
from wattlab.samples import Gap, Marker, SampleBatch, SourceDescriptor
from wattlab.sync.bus import BusPublisher

# A poll's chunks of one stream leave as one message (the runner flushes after each poll).
COALESCE_ROWS = 65536
# What a source keeps for the recorder: sent but not yet on disk (replayed to a restarted
# recorder), then unsent; beyond both, batches are dropped and the loss sent as a gap.
SOURCE_WINDOW_BYTES = 64 * 1024 * 1024
SOURCE_BACKLOG_BYTES = 32 * 1024 * 1024
# At the end, how long a source waits for the recorder to confirm its last batches on disk.
SOURCE_LINGER_S = 10.0


class SourceRunner:
    """Drives one acquirer in its own thread and publishes its readings."""

    def __init__(
        self, name: str, acquirer: Acquirer, endpoint: str, *,
        window_bytes: int = SOURCE_WINDOW_BYTES, backlog_bytes: int = SOURCE_BACKLOG_BYTES,
        continue_seq: bool = False, on_end: Callable[[], None] | None = None,
        linger_s: float = SOURCE_LINGER_S,
    ) -> None:
        """Prepare (the thread starts in ``start``).

        ``continue_seq``: number batches on from where the recorder has the stream (a
        restarted source process), after waiting for the recorder's acknowledgement.
        ``on_end``: called by the thread as its last act, so a watcher can sleep until then.
        ``linger_s``: at the end, how long to wait for the recorder's last confirmations.
        """
        self.name = name
        self.acquirer = acquirer
        self.endpoint = endpoint
        self.window_bytes = window_bytes
        self.backlog_bytes = backlog_bytes
        self.continue_seq = continue_seq
        self.on_end = on_end
        self.linger_s = linger_s
        # rows handed to the bus per stream (dropped ones too: they leave as gap rows), so
        # the session can say what a recorder that died never kept
        self.rows_sent: dict[str, int] = {}
        self.descriptors: list[SourceDescriptor] = []
        self.error: str | None = None
        self.dropped_batches = 0
        self.dropped_rows = 0
        self._stop = threading.Event()
        self._abandoned = False
        self._opened = threading.Event()
        self._seq: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name=f"source-{name}", daemon=True)

    def start(self, open_timeout_s: float = 30.0) -> list[SourceDescriptor]:
        """Start the thread and wait until the instrument is open (or failed to open)."""
        self._thread.start()
        if not self._opened.wait(open_timeout_s):
            raise WattlabError(f"source {self.name}: instrument did not open in {open_timeout_s} s")
        if self.error is not None and not self.descriptors:
            raise WattlabError(f"source {self.name}: {self.error}")
        return self.descriptors

    def request_stop(self) -> None:
        """Tell the thread to finish (it reads what is left, says "end", closes)."""
        self._stop.set()
        wake = getattr(self.acquirer, "wake", None)
        if wake is not None:
            wake()

    def abandon(self) -> None:
        """Stop without waiting for a recorder that is gone for good (full disk)."""
        self._abandoned = True
        self.request_stop()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop and wait for the thread (default: its linger time and 5 s)."""
        self.request_stop()
        if self._thread.ident is not None:  # never started (an earlier source failed)
            self._thread.join(self.linger_s + 5.0 if timeout_s is None else timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _publish(self, publisher: BusPublisher, readings: list[Reading]) -> None:
        if not readings:
            publisher.idle()
            return
        for item in readings:
            if isinstance(item, Chunk):
                seq = self._seq.get(item.source_id, 0)
                self._seq[item.source_id] = seq + 1
                self.rows_sent[item.source_id] = (self.rows_sent.get(item.source_id, 0)
                                                  + len(item.t_host_ns))
                publisher.send_batch(
                    SampleBatch(item.source_id, seq, item.t_host_ns, item.values,
                                item.t_raw, item.flags)
                )
            elif isinstance(item, Marker):
                publisher.send_marker(item)
            else:
                publisher.send_gap(item)
        publisher.flush()

    def _run(self) -> None:
        publisher = BusPublisher(self.endpoint, coalesce_rows=COALESCE_ROWS,
                                 linger_ms=round(self.linger_s * 1000),
                                 window_bytes=self.window_bytes, backlog_bytes=self.backlog_bytes)
        try:
            try:
                self.descriptors = self.acquirer.open()
            except Exception as e:
                self.error = str(e) if isinstance(e, WattlabError) else repr(e)
                self._opened.set()
                return
            for desc in self.descriptors:
                self._seq[desc.source_id] = 0
                self.rows_sent[desc.source_id] = 0
                publisher.announce(desc)
            if self.continue_seq:
                publisher.wait_ready(30.0)
                self._seq.update(publisher.acked_seq_next)
            self._opened.set()
            while not self._stop.is_set():
                self._publish(publisher, self.acquirer.poll())
            self._publish(publisher, self.acquirer.poll())
            if isinstance(self.acquirer, Flushable):
                self._publish(publisher, self.acquirer.flush())
        except Exception as e:
            self.error = f"{e}" if isinstance(e, WattlabError) else traceback.format_exc(limit=3)
            now = time.monotonic_ns()
            for desc in self.descriptors:
                publisher.send_gap(Gap(desc.source_id, f"source failed: {e}"[:128], t_first_ns=now))
        finally:
            try:
                self.acquirer.close()
            finally:
                for source_id, seq in self._seq.items():
                    publisher.end(source_id, seq - 1)
                publisher.close(wait=not self._abandoned)
                self.dropped_batches = publisher.dropped_batches
                self.dropped_rows = publisher.dropped_rows
                self._opened.set()
                if self.on_end is not None:
                    self.on_end()
