"""The recorder: receives every source's messages and writes the run file.

Small messages are coalesced per source and written in large slices (one HDF5 write per
source every flush interval or every ``COALESCE_ROWS`` rows), which is what lets the
recorder keep up with many fast sources. Every sequence gap it sees becomes a row in
``/gaps``; a malformed message is rejected, counted and logged, and the session goes on.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import zmq

from wattlab.errors import MalformedMessageError, WattlabError
from wattlab.samples import Gap, Marker, SampleBatch, SourceDescriptor
from wattlab.sync import message
from wattlab.sync.run_writer import RunFileWriter

COALESCE_ROWS = 65536
MAX_ORPHAN_BATCHES = 1000
RECV_BURST = 256


@dataclass
class RecorderConfig:
    """Everything the recorder process needs; passed as JSON on its command line."""

    endpoint: str
    output: str
    session_start_ns: int
    root_attrs: dict[str, Any] = field(default_factory=dict)
    expected_sources: list[str] = field(default_factory=list)
    flush_interval_s: float = 0.5
    drain_timeout_s: float = 5.0
    swmr_after_s: float = 5.0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


@dataclass
class _SourceState:
    desc: SourceDescriptor
    next_seq: int = 0
    rows: int = 0
    batches: int = 0
    gaps: int = 0
    samples_lost: int = 0
    duplicates: int = 0
    ended: bool = False
    last_t_ns: int = -1
    pending: list[tuple[Any, Any, Any, Any]] = field(default_factory=list)
    pending_rows: int = 0


class Recorder:
    """Binds the bus, writes the file; ``run()`` returns when told to stop and drained."""

    def __init__(self, config: RecorderConfig, context: zmq.Context[Any] | None = None) -> None:
        self.config = config
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.RCVHWM, 100_000)
        self._socket.setsockopt(zmq.LINGER, 1000)
        try:
            self._socket.bind(config.endpoint)
            self.writer = RunFileWriter(config.output, config.root_attrs, config.session_start_ns)
        except (zmq.ZMQError, WattlabError):
            self._socket.close(0)
            raise
        self._sources: dict[str, _SourceState] = {}
        self._orphans: dict[str, list[tuple[bytes, SampleBatch]]] = {}
        self._markers: list[Marker] = []
        self._gaps: list[Gap] = []
        self._stop_requested: tuple[bytes, str] | None = None
        self._drain_deadline = 0.0
        self._started = time.monotonic()
        self.rejected = 0
        self.last_rejection = ""

    # ---- message handling -------------------------------------------------------------
    def _reply(self, identity: bytes, **fields: Any) -> None:
        self._socket.send_multipart([identity, *message.encode_reply(**fields)])

    def _reject(self, identity: bytes, reason: str) -> None:
        self.rejected += 1
        self.last_rejection = reason
        print(f"wattlab recorder: rejected a message from peer {identity.hex()[:12]}: {reason}",
              file=sys.stderr)

    def handle(self, frames: list[Any]) -> None:
        identity = bytes(frames[0])
        body = frames[1:]
        try:
            head = message.decode_header(body)
            kind = head["type"]
            if kind == "batch":
                self._on_batch(identity, message.decode_batch(head, body))
            elif kind == "descriptor":
                self._on_descriptor(identity, message.decode_descriptor(head))
            elif kind == "marker":
                self._markers.append(message.decode_marker(head))
            elif kind == "gap":
                self._on_gap(message.decode_gap(head))
            elif kind == "end":
                self._on_end(head["source"], head.get("last_seq"))
            elif kind == "control":
                self._on_control(identity, head)
            else:
                raise MalformedMessageError(f"message type {kind!r} is not for the recorder")
        except MalformedMessageError as e:
            self._reject(identity, str(e))

    def _on_descriptor(self, identity: bytes, desc: SourceDescriptor) -> None:
        try:
            self.writer.add_source(desc)
        except WattlabError as e:
            raise MalformedMessageError(str(e)) from e
        if desc.source_id not in self._sources:
            self._sources[desc.source_id] = _SourceState(desc)
        self._reply(identity, ack=desc.source_id)
        for orphan_identity, batch in self._orphans.pop(desc.source_id, []):
            self._on_batch(orphan_identity, batch)
        if set(self.config.expected_sources) <= set(self._sources):
            self.writer.start_swmr()

    def _on_batch(self, identity: bytes, batch: SampleBatch) -> None:
        state = self._sources.get(batch.source_id)
        if state is None:
            orphans = self._orphans.setdefault(batch.source_id, [])
            if not orphans:
                self._reply(identity, describe=batch.source_id)
            if len(orphans) < MAX_ORPHAN_BATCHES:
                orphans.append((identity, batch))
            else:
                self._gaps.append(Gap(batch.source_id, "batch arrived with no descriptor; dropped",
                                      batch.seq, batch.seq, samples_lost=batch.n))
            return
        width = len(state.desc.channels)
        if batch.values.shape[1] != width:
            self._gaps.append(Gap(batch.source_id, "malformed batch rejected: channel count",
                                  batch.seq, batch.seq, samples_lost=batch.n))
            state.next_seq = max(state.next_seq, batch.seq + 1)
            raise MalformedMessageError(
                f"source {batch.source_id!r} sent {batch.values.shape[1]} channels, "
                f"descriptor has {width}"
            )
        if batch.seq < state.next_seq:
            state.duplicates += 1
            return
        if batch.seq > state.next_seq:
            reason = "sent before the recorder joined" if state.batches == 0 else "sequence gap"
            self._record_gap(state, state.next_seq, batch.seq - 1, batch, reason)
        state.next_seq = batch.seq + 1
        state.batches += 1
        if batch.n == 0:
            return
        t_raw = batch.t_raw if batch.t_raw is not None else batch.t_host_ns
        flags = batch.flags if batch.flags is not None else np.zeros(batch.n, dtype=np.uint8)
        state.pending.append((batch.t_host_ns, t_raw, batch.values, flags))
        state.pending_rows += batch.n
        state.rows += batch.n
        state.last_t_ns = int(batch.t_host_ns[-1])
        if state.pending_rows >= COALESCE_ROWS:
            self._write_pending(state)

    def _record_gap(
        self, state: _SourceState, first: int, last: int, batch: SampleBatch | None, reason: str
    ) -> None:
        t_last = int(batch.t_host_ns[0]) if batch is not None and batch.n else -1
        self._gaps.append(Gap(state.desc.source_id, reason, first, last, state.last_t_ns, t_last))
        state.gaps += 1

    def _on_gap(self, gap: Gap) -> None:
        self._gaps.append(gap)
        state = self._sources.get(gap.source)
        if state is not None:
            state.gaps += 1
            state.samples_lost += max(gap.samples_lost, 0)

    def _on_end(self, source_id: str, last_seq: Any) -> None:
        state = self._sources.get(source_id)
        if state is None:
            raise MalformedMessageError(f"end from unknown source {source_id!r}")
        if isinstance(last_seq, int) and last_seq >= state.next_seq:
            self._record_gap(state, state.next_seq, last_seq, None, "lost before the end")
            state.next_seq = last_seq + 1
        state.ended = True

    def _on_control(self, identity: bytes, head: dict[str, Any]) -> None:
        command = head.get("command")
        rid = head.get("rid")
        if command == "sync":
            self._reply(identity, rid=rid)
        elif command == "status":
            self._reply(identity, rid=rid, **self.status())
        elif command == "stop":
            self._stop_requested = (identity, str(rid))
            self._drain_deadline = time.monotonic() + self.config.drain_timeout_s
        else:
            raise MalformedMessageError(f"unknown control command {command!r}")

    # ---- writing ------------------------------------------------------------------------
    def _write_pending(self, state: _SourceState) -> None:
        if not state.pending:
            return
        parts = state.pending
        state.pending = []
        state.pending_rows = 0

        def cat(i: int) -> npt.NDArray[Any]:
            return parts[0][i] if len(parts) == 1 else np.concatenate([p[i] for p in parts])

        self.writer.append(state.desc.source_id, cat(0), cat(1), cat(2), cat(3))

    def flush(self) -> None:
        for state in self._sources.values():
            self._write_pending(state)
        if self._markers:
            self.writer.add_markers(self._markers)
            self._markers = []
        if self._gaps:
            self.writer.add_gaps(self._gaps)
            self._gaps = []
        if not self.writer.swmr and time.monotonic() - self._started > self.config.swmr_after_s:
            self.writer.start_swmr()
        self.writer.flush()

    def status(self) -> dict[str, Any]:
        return {
            "sources": {
                sid: {
                    "rows": s.rows,
                    "batches": s.batches,
                    "gaps": s.gaps,
                    "samples_lost": s.samples_lost,
                    "duplicates": s.duplicates,
                    "ended": s.ended,
                }
                for sid, s in self._sources.items()
            },
            "rejected": self.rejected,
            "last_rejection": self.last_rejection,
            "swmr": self.writer.swmr,
        }

    # ---- main loop ----------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop without a control client (SIGTERM): drain, close, exit."""
        if self._stop_requested is None:
            self._stop_requested = (b"", "")
            self._drain_deadline = time.monotonic() + self.config.drain_timeout_s

    def _drained(self) -> bool:
        all_ended = all(s.ended for s in self._sources.values())
        return all_ended or time.monotonic() >= self._drain_deadline

    def run(self) -> dict[str, Any]:
        """Receive and write until a stop request has been drained; returns final status."""
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        next_flush = time.monotonic() + self.config.flush_interval_s
        while True:
            wait_ms = max(0, int((next_flush - time.monotonic()) * 1000))
            if poller.poll(min(wait_ms, 100)):
                for _ in range(RECV_BURST):
                    try:
                        frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self.handle(frames)
            if time.monotonic() >= next_flush:
                self.flush()
                next_flush = time.monotonic() + self.config.flush_interval_s
            if self._stop_requested is not None and self._drained():
                break
        return self._finish()

    def _finish(self) -> dict[str, Any]:
        for state in self._sources.values():
            if not state.ended:
                self._record_gap(state, state.next_seq, -1, None, "source did not end cleanly")
        for source_id, orphans in self._orphans.items():
            self._gaps.append(Gap(source_id, "never described; batches dropped",
                                  samples_lost=sum(b.n for _, b in orphans)))
        self.flush()
        final = self.status()
        self.writer.close({
            "session_end_monotonic_ns": time.monotonic_ns(),
            "recorder_status_json": json.dumps(final, sort_keys=True),
        })
        if self._stop_requested is not None and self._stop_requested[0]:
            identity, rid = self._stop_requested
            self._reply(identity, rid=rid, stopped=True, **final)
        self._socket.close()
        return final


def main(argv: list[str] | None = None) -> int:
    """Entry point of the recorder process the session starts."""
    parser = argparse.ArgumentParser(prog="wattlab-recorder")
    parser.add_argument("config_json")
    args = parser.parse_args(argv)
    # Ctrl-C reaches the whole process group; the session decides when the recorder stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    config = RecorderConfig(**json.loads(args.config_json))
    config.root_attrs.setdefault("recorder_host", socket.gethostname())
    try:
        recorder = Recorder(config)
    except WattlabError as e:
        print(f"wattlab recorder: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda signum, frame: recorder.request_stop())
    recorder.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
