"""The recorder: receives every source's messages and writes the run file.

Small messages are coalesced per source and written in large slices (one HDF5 write per
source every flush interval or every ``COALESCE_ROWS`` rows), which is what lets the
recorder keep up with many fast sources. Every sequence gap it sees becomes a row in
``/gaps``; a malformed message is rejected, counted and logged, and the session goes on.

Remote agents (``listen``) reach a second ROUTER socket that speaks CURVE only and asks a
ZAP authenticator about every peer. Each remote message carries its peer's name (the key
file's name, ZeroMQ ``User-Id``); a peer may only send streams named ``<name>.*``, never
control the session, and its times are mapped onto this host's clock by the clock service
before they are written (and once more, with the final model, at close).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import zmq

from wattlab.errors import MalformedMessageError, UsageError, WattlabError
from wattlab.exit_watch import open_pidfd
from wattlab.runfile.writer import ResumePoint, RunFileWriter
from wattlab.samples import Gap, Marker, SampleBatch, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.clock_service import ClockPinger
from wattlab.sync.recorder.disk_full import (
    SealRequest,
    disk_full_error,
    free_reserve,
    make_reserve,
    stop_recording,
)
from wattlab.sync.recorder.stream_metrics import StreamMetrics

if TYPE_CHECKING:
    from wattlab.sync.bus.security import CurveServer
    from wattlab.sync.recorder.prometheus import Exporter

COALESCE_ROWS = 65536
MAX_ORPHAN_BATCHES = 1000
RECV_BURST = 256
# without a pidfd for the session (the parent): look this often whether it is still there;
# each wake-up costs CPU (issue 10), and a dead session is rare and noticed soon enough
IDLE_WAKE_MS = 2000
RESYNC_WAKE_MS = 500  # while a resumed source is due to resend: look at its deadline this often
MAX_HELD_PER_HOST = 10_000
MAX_ANNOUNCED_SOURCES = 1000
REMOTE_CONTROL = ("sync", "hello")
RECV_HWM = 10_000
# kernel socket buffer: large messages cross in fewer system calls and wake-ups
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
FLUSH_BYTES = 8 * 1024 * 1024  # flush early past this much, so replay windows keep moving
RESEND_TIMEOUT_S = 2.0  # a resumed source that does not resend in time: the hole is a gap
MAX_HELD_ROWS = 4_000_000


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
    listen: str = ""  # tcp endpoint for remote agents (CURVE only); "" = local only
    server_key: str = ""  # this recorder's NAME.key_secret
    allowed_keys: str = ""  # folder of agents' NAME.key files
    expected_hosts: list[str] = field(default_factory=list)
    clock_interval_s: float = 0.1
    clock_window_s: float = 1.0
    resume: bool = False  # reopen ``output`` after a crashed recorder (see docs/reliability.md)
    test_write_delay_s: float = 0.0  # fault injection: a disk this much slower per write
    parent_pid: int = 0  # the session: when it is gone, drain and close the file (0: never)
    prometheus: str = ""  # HOST:PORT: serve the streams' figures to Prometheus ("" = no)

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
    host: str | None = None  # remote host that owns the stream; None: this host
    pending: list[tuple[Any, Any, Any, Any, Any]] = field(default_factory=list)
    pending_rows: int = 0
    identity: bytes | None = None  # the publisher that last sent for this stream
    acked_seq: int = 0  # next_seq last confirmed to the publisher as on disk
    progress_dirty: bool = False
    resync: bool = False  # resumed after a crash: hold out-of-order batches, ask for resend
    resend_deadline: float = 0.0
    held: list[SampleBatch | Gap] = field(default_factory=list)
    held_rows: int = 0
    end_seq: int | None = None  # "end" that came while batches were held


class Recorder:
    """Binds the bus, writes the file; ``run()`` returns when told to stop and drained."""

    def __init__(self, config: RecorderConfig, context: zmq.Context[Any] | None = None) -> None:
        self.config = config
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.RCVHWM, RECV_HWM)
        self._socket.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
        self._socket.setsockopt(zmq.LINGER, 1000)
        self._remote: zmq.Socket[Any] | None = None
        self._remote_context: zmq.Context[Any] | None = None
        self._curve: CurveServer | None = None
        self._exporter: Exporter | None = None
        try:
            self._socket.bind(config.endpoint)
            if config.listen:
                self._bind_remote(config)
            self._metrics, self._exporter = self._start_exporter(config.prometheus)
            points: dict[str, ResumePoint] = {}
            if config.resume:
                self.writer, points = RunFileWriter.resume(config.output,
                                                           config.session_start_ns)
            else:
                self.writer = RunFileWriter(config.output, config.root_attrs,
                                            config.session_start_ns)
            self._set_reserve_aside()
        except (zmq.ZMQError, WattlabError):
            self._close_sockets()
            raise
        self._peer_socket = self._socket
        self._pinger = ClockPinger(config.clock_interval_s, config.clock_window_s)
        self._held: dict[str, list[Callable[[], None]]] = {}
        self._held_lost: dict[str, int] = {}
        self._finish_sent = False
        self._sources: dict[str, _SourceState] = {}
        self._orphans: dict[str, list[tuple[bytes, SampleBatch]]] = {}
        self._markers: list[Marker] = []
        self._gaps: list[Gap] = []
        self._stop_requested: tuple[bytes, str] | None = None
        self._drain_deadline = 0.0
        self._started = time.monotonic()
        self.rejected = 0
        self.last_rejection = ""
        self._bytes_since_flush = 0
        self._new_objects = False  # a source added since the last flush
        self._resyncing: set[str] = set()
        if config.resume:
            self._resume(points)

    def _set_reserve_aside(self) -> None:
        """Room to finish the file if the disk fills (see wattlab.sync.recorder.disk_full)."""
        try:
            make_reserve(self.config.output)
        except OSError as e:
            if self.config.resume:  # carry on: a full disk then ends without the /gaps row
                print(f"wattlab recorder: no reserve beside {self.config.output}: {e}",
                      file=sys.stderr)
                return
            self.writer.close(fit_device_clocks=False)
            os.unlink(self.config.output)  # just created, holds nothing: never half a run
            raise UsageError(f"{self.config.output}: no room for the "
                             f"{os.path.basename(self.config.output)} reserve: {e}") from e

    @staticmethod
    def _start_exporter(address: str) -> tuple[StreamMetrics | None, Exporter | None]:
        """The Prometheus endpoint: a thread fed with the rows as they are written."""
        if not address:
            return None, None
        from wattlab.sync.recorder.prometheus import Exporter

        metrics = StreamMetrics()
        exporter = Exporter(address, metrics)
        print(f"wattlab recorder: Prometheus metrics at {exporter.url}", file=sys.stderr,
              flush=True)
        return metrics, exporter

    def stop_for_full_disk(self, error: str) -> None:
        """Stop at the first full-disk error: answer a pending stop, then finish the file.

        Never returns: the process becomes ``wattlab.sync.recorder.disk_full``. Nothing is written
        through this process's HDF5 handles any more.
        """
        failed_at_ns = time.monotonic_ns()
        if self._stop_requested is not None and self._stop_requested[0]:
            identity, rid = self._stop_requested
            self._peer_socket = self._socket
            self._reply(identity, rid=rid, stopped=False, disk_full=error)
        self._context.destroy(linger=1000)  # the reply leaves before exec
        stop_recording(SealRequest(self.config.output, self.config.session_start_ns,
                                   failed_at_ns, error))

    def _resume(self, points: dict[str, ResumePoint]) -> None:
        """Carry on a crashed recorder's file: every stream waits for its publisher's resend."""
        for source_id, point in points.items():
            desc = self.writer.descriptor(source_id)
            if self._metrics is not None:
                self._metrics.describe(desc)
            host = self.writer.remote_host(source_id) or None
            self._sources[source_id] = _SourceState(
                desc, next_seq=point.seq_next, rows=point.rows, ended=point.ended, host=host,
                acked_seq=point.seq_next, resync=not point.ended)
        cut = sum(p.rows_dropped for p in points.values())
        self._markers.append(Marker(time.monotonic_ns(), "recorder restarted", "point",
                                    "recorder", {"rows_cut": cut}))
        self.writer.start_swmr()

    def _bind_remote(self, config: RecorderConfig) -> None:
        """The CURVE-only socket for agents on other hosts."""
        if not config.listen.startswith("tcp://"):
            raise UsageError(f"listen endpoint {config.listen!r} must be tcp://ADDRESS:PORT")
        if not config.server_key or not config.allowed_keys:
            raise UsageError("listening for agents needs the recorder's secret key and a folder "
                             "of allowed agent keys; the remote bus is never open")
        # imported here: CURVE's authenticator pulls in asyncio, start-up a local run skips
        from wattlab.sync.bus.security import CurveServer, load_allowed_keys, load_keypair

        keys = load_keypair(config.server_key)
        allowed = load_allowed_keys(config.allowed_keys)
        self._remote_context = zmq.Context()
        self._curve = CurveServer(self._remote_context, keys, allowed)
        self._remote = self._remote_context.socket(zmq.ROUTER)
        self._remote.setsockopt(zmq.RCVHWM, 100_000)
        self._remote.setsockopt(zmq.LINGER, 1000)
        self._curve.apply(self._remote)
        try:
            self._remote.bind(config.listen)
        except zmq.ZMQError as e:
            raise UsageError(f"cannot listen on {config.listen}: {e}") from e

    @property
    def listen_endpoint(self) -> str:
        """Where agents connect (with the port the OS chose for ``:0``)."""
        if self._remote is None:
            return ""
        endpoint = self._remote.getsockopt(zmq.LAST_ENDPOINT)
        return endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)

    def _close_sockets(self) -> None:
        if self._exporter is not None:
            self._exporter.close()
        self._socket.close(0)
        if self._remote is not None:
            self._remote.close(0)
        if self._curve is not None:
            self._curve.stop()
        if self._remote_context is not None:
            self._remote_context.term()

    # ---- message handling -------------------------------------------------------------
    def _reply(self, identity: bytes, **fields: Any) -> None:
        self._peer_socket.send_multipart([identity, *message.encode_reply(**fields)])

    def _send_remote(self, identity: bytes, frames: list[Any]) -> None:
        if self._remote is not None:
            self._remote.send_multipart([identity, *frames])

    def _reject(self, identity: bytes, reason: str) -> None:
        self.rejected += 1
        self.last_rejection = reason
        print(f"wattlab recorder: rejected a message from peer {identity.hex()[:12]}: {reason}",
              file=sys.stderr)

    def handle(self, frames: list[Any], host: str | None = None, t_recv_ns: int = 0) -> None:
        """One message; ``host`` is the authenticated name of a remote peer (None: local)."""
        identity = bytes(frames[0])
        body = frames[1:]
        self._peer_socket = self._socket if host is None else (self._remote or self._socket)
        try:
            head = message.decode_header(body)
            if host is not None:
                self._handle_remote(identity, host, head, body, t_recv_ns)
                return
            kind = head["type"]
            if kind in ("descriptor", "batch", "gap", "end"):
                self._check_local_source(head["source"])
            if kind == "batch":
                self._on_batch(identity, message.decode_batch(head, body))
            elif kind == "descriptor":
                self._on_descriptor(identity, message.decode_descriptor(head))
            elif kind == "marker":
                self._markers.append(message.decode_marker(head))
            elif kind == "gap":
                self._on_gap(message.decode_gap(head), identity)
            elif kind == "end":
                self._on_end(head["source"], message.decode_end(head))
            elif kind == "control":
                self._on_control(identity, head)
            else:
                raise MalformedMessageError(f"message type {kind!r} is not for the recorder")
        except MalformedMessageError as e:
            self._reject(identity, str(e))

    # ---- remote peers ---------------------------------------------------------------------
    def _check_local_source(self, source_id: str) -> None:
        state = self._sources.get(source_id)
        if state is not None and state.host is not None:
            raise MalformedMessageError(f"stream {source_id!r} belongs to host {state.host!r}")

    def _check_remote_source(self, host: str, source_id: str) -> None:
        """An agent may only speak for streams named after it (and already its own)."""
        state = self._sources.get(source_id)
        if state is not None and state.host != host:
            owner = "this host" if state.host is None else f"host {state.host!r}"
            raise MalformedMessageError(f"host {host!r} sent for stream {source_id!r} of {owner}")
        if not source_id.startswith(f"{host}."):
            raise MalformedMessageError(
                f"host {host!r} may only send streams named '{host}.*', not {source_id!r}")

    def _handle_remote(self, identity: bytes, host: str, head: dict[str, Any], body: list[Any],
                       t_recv_ns: int) -> None:
        kind = head["type"]
        source = head["source"]
        if kind == "clock":
            self._on_clock(identity, host, head, t_recv_ns)
        elif kind == "control":
            if head.get("command") not in REMOTE_CONTROL:
                raise MalformedMessageError(
                    f"host {host!r} may not send control command {head.get('command')!r}")
            self._on_control(identity, head, host)
        elif kind == "descriptor":
            self._check_remote_source(host, source)
            self._on_descriptor(identity, message.decode_descriptor(head), host)
        elif kind == "marker":
            marker = message.decode_marker(head)
            if marker.source != host and not marker.source.startswith(f"{host}."):
                raise MalformedMessageError(
                    f"host {host!r} sent a marker for source {marker.source!r}")
            self._when_clock(host, lambda: self._markers.append(self._marker_to_local(host,
                                                                                      marker)))
        elif kind in ("batch", "gap", "end"):
            self._check_remote_source(host, source)
            if kind == "batch":
                batch = message.decode_batch(head, body)
                self._when_clock(host, lambda: self._on_batch(identity, batch))
            elif kind == "gap":
                gap = message.decode_gap(head)
                self._when_clock(host, lambda: self._on_gap(self._gap_to_local(host, gap)))
            else:
                last_seq = message.decode_end(head)
                self._when_clock(host, lambda: self._on_end(source, last_seq))
        else:
            raise MalformedMessageError(f"message type {kind!r} is not for the recorder")

    def _when_clock(self, host: str, action: Callable[[], None]) -> None:
        """Run now if the host's clock is known, else keep it (in order) until it is."""
        tracker = self._pinger.trackers.get(host)
        held = self._held.get(host)
        if tracker is not None and tracker.ready and not held:
            action()
            return
        held = self._held.setdefault(host, [])
        if len(held) >= MAX_HELD_PER_HOST:
            self._held_lost[host] = self._held_lost.get(host, 0) + 1
            raise MalformedMessageError(f"host {host!r} sends but answers no clock probe; dropped")
        held.append(action)

    def _release_held(self, host: str) -> None:
        for action in self._held.pop(host, []):
            try:
                action()
            except MalformedMessageError as e:
                self._reject(b"", f"(held from {host}) {e}")

    def _on_clock(self, identity: bytes, host: str, head: dict[str, Any], t4_ns: int) -> None:
        if head["source"] != host:
            raise MalformedMessageError(f"host {host!r} sent clock traffic as {head['source']!r}")
        if head.get("hello") is True:
            sources = head.get("sources")
            if sources is not None and (
                not isinstance(sources, list) or len(sources) > MAX_ANNOUNCED_SOURCES
                or not all(isinstance(x, str) and x.startswith(f"{host}.") for x in sources)
            ):
                raise MalformedMessageError(f"host {host!r} announced a bad source list")
            self._pinger.hello(identity, host, sources)
            if self._finish_sent:
                self._pinger.finish_all(self._send_remote)
        elif "probe" in head:
            self._pinger.on_reply(identity, host, head, t4_ns)
            if self._pinger.trackers[host].ready and self._held.get(host):
                self._release_held(host)
        else:
            raise MalformedMessageError(f"clock message from {host!r} is neither hello nor reply")

    def _to_local(self, host: str, t_ns: int) -> int:
        if t_ns < 0:
            return t_ns
        return int(self._pinger.trackers[host].to_local_ns(np.array([t_ns]))[0])

    def _marker_to_local(self, host: str, marker: Marker) -> Marker:
        gpu = None if marker.t_gpu_ns is None else self._to_local(host, marker.t_gpu_ns)
        return Marker(self._to_local(host, marker.t_host_ns), marker.name, marker.kind,
                      marker.source, {**marker.payload, "t_sender_ns": marker.t_host_ns},
                      gpu, marker.gpu_uncertainty_ns)

    def _gap_to_local(self, host: str, gap: Gap) -> Gap:
        return Gap(gap.source, gap.reason, gap.seq_first, gap.seq_last,
                   self._to_local(host, gap.t_first_ns), self._to_local(host, gap.t_last_ns),
                   gap.samples_lost)

    def _on_descriptor(
        self, identity: bytes, desc: SourceDescriptor, host: str | None = None
    ) -> None:
        try:
            self.writer.add_source(desc, remote_host=host or "")
        except WattlabError as e:
            if disk_full_error(e):
                raise  # not the message's fault: the recording stops
            raise MalformedMessageError(str(e)) from e
        self._new_objects = True
        if self._metrics is not None:
            self._metrics.describe(desc)
        state = self._sources.get(desc.source_id)
        if state is None:
            state = self._sources[desc.source_id] = _SourceState(desc, host=host)
        elif state.ended:
            state.ended = False  # announced again: a restarted source carries on
            state.end_seq = None
            changed = sorted(k for k, v in desc.config.items()
                             if state.desc.config.get(k) != v)[:20]
            self._markers.append(Marker(time.monotonic_ns(), "source restarted", "point",
                                        desc.source_id, {"config_changed": changed}))
        self._reply(identity, ack=desc.source_id, next_seq=state.next_seq)
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
                                      batch.seq, batch.last_seq, samples_lost=batch.n))
            return
        width = len(state.desc.channels)
        if batch.values.shape[1] != width:
            self._gaps.append(Gap(batch.source_id, "malformed batch rejected: channel count",
                                  batch.seq, batch.last_seq, samples_lost=batch.n))
            state.next_seq = max(state.next_seq, batch.last_seq + 1)
            raise MalformedMessageError(
                f"source {batch.source_id!r} sent {batch.values.shape[1]} channels, "
                f"descriptor has {width}"
            )
        state.identity = identity
        self._order(state, batch.seq, batch.last_seq, batch)

    def _order(self, state: _SourceState, seq: int, last_seq: int,
               item: SampleBatch | Gap) -> None:
        """Take a batch (or a gap covering sequence numbers) in sequence order."""
        if last_seq < state.next_seq:
            if isinstance(item, SampleBatch):
                state.duplicates += 1
            return
        if seq > state.next_seq and state.resync:
            self._hold(state, item)
            return
        if seq > state.next_seq:
            reason = "sent before the recorder joined" if state.batches == 0 else "sequence gap"
            t_next = self._first_time(state, item)
            self._record_gap(state, state.next_seq, seq - 1, t_next, reason)
        state.next_seq = last_seq + 1
        self._accept(state, item)
        if state.held:
            self._release(state)
        if not state.held and state.resync:
            self._settled(state)

    def _accept(self, state: _SourceState, item: SampleBatch | Gap) -> None:
        """The next item in sequence: rows to write, or a gap that stands for batches."""
        if isinstance(item, SampleBatch):
            self._take_rows(state, item)
        else:
            self._gaps.append(item)
            state.gaps += 1
            state.samples_lost += max(item.samples_lost, 0)

    def _first_time(self, state: _SourceState, item: SampleBatch | Gap) -> int:
        if isinstance(item, Gap):
            return item.t_first_ns
        if item.n == 0:
            return -1
        if state.host is not None:
            return int(self._pinger.trackers[state.host].to_local_ns(item.t_host_ns[:1])[0])
        return int(item.t_host_ns[0])

    # ---- after a recorder restart ------------------------------------------------------------
    def _hold(self, state: _SourceState, item: SampleBatch | Gap) -> None:
        """Keep a batch that came ahead of what the crashed recorder lost; ask for the rest."""
        if not state.held and state.identity is not None:
            self._send_to(state, message.encode_reply(resend=state.desc.source_id,
                                                      from_seq=state.next_seq))
            state.resend_deadline = time.monotonic() + RESEND_TIMEOUT_S
        state.held.append(item)
        state.held_rows += item.n if isinstance(item, SampleBatch) else 0
        self._resyncing.add(state.desc.source_id)
        if state.held_rows > MAX_HELD_ROWS:
            self._give_up_resync(state)

    def _release(self, state: _SourceState) -> None:
        """Process held batches that are in order now (resent ones filled the hole)."""
        state.held.sort(key=_seq_of)
        while state.held and _seq_of(state.held[0]) <= state.next_seq:
            item = state.held.pop(0)
            state.held_rows -= item.n if isinstance(item, SampleBatch) else 0
            last = item.last_seq if isinstance(item, SampleBatch) else item.seq_last
            if last < state.next_seq:
                state.duplicates += isinstance(item, SampleBatch)
                continue
            state.next_seq = last + 1
            self._accept(state, item)

    def _settled(self, state: _SourceState) -> None:
        state.resync = False
        self._resyncing.discard(state.desc.source_id)
        if state.end_seq is not None:
            end_seq, state.end_seq = state.end_seq, None
            self._on_end(state.desc.source_id, end_seq)

    def _give_up_resync(self, state: _SourceState) -> None:
        """No resend came (publisher gone, or too much held): the hole is recorded as a gap."""
        state.resync = False
        held, state.held, state.held_rows = sorted(state.held, key=_seq_of), [], 0
        for item in held:
            if isinstance(item, SampleBatch):
                self._order(state, item.seq, item.last_seq, item)
            else:
                self._order(state, item.seq_first, item.seq_last, item)
        self._settled(state)

    def _check_resync(self) -> None:
        now = time.monotonic()
        for source_id in list(self._resyncing):
            state = self._sources[source_id]
            if state.held and now >= state.resend_deadline:
                self._give_up_resync(state)

    def _take_rows(self, state: _SourceState, batch: SampleBatch) -> None:
        t_host = batch.t_host_ns
        sender = None
        if state.host is not None:
            sender = batch.t_host_ns
            t_host = self._pinger.trackers[state.host].to_local_ns(sender)
        state.batches += 1
        if batch.n == 0:
            return
        t_raw = batch.t_raw if batch.t_raw is not None else batch.t_host_ns
        flags = batch.flags if batch.flags is not None else np.zeros(batch.n, dtype=np.uint8)
        state.pending.append((t_host, t_raw, batch.values, flags, sender))
        state.pending_rows += batch.n
        state.rows += batch.n
        state.last_t_ns = int(t_host[-1])
        if state.pending_rows >= COALESCE_ROWS:
            self._write_pending(state)

    def _record_gap(
        self, state: _SourceState, first: int, last: int, t_next_ns: int, reason: str
    ) -> None:
        self._gaps.append(Gap(state.desc.source_id, reason, first, last, state.last_t_ns,
                              t_next_ns))
        state.gaps += 1

    def _on_gap(self, gap: Gap, identity: bytes | None = None) -> None:
        state = self._sources.get(gap.source)
        if state is not None and identity is not None:
            state.identity = identity
        if state is not None and 0 <= gap.seq_first <= gap.seq_last:
            self._order(state, gap.seq_first, gap.seq_last, gap)  # it stands for those batches
            return
        self._gaps.append(gap)
        if state is not None:
            state.gaps += 1
            state.samples_lost += max(gap.samples_lost, 0)

    def _on_end(self, source_id: str, last_seq: Any) -> None:
        state = self._sources.get(source_id)
        if state is None:
            raise MalformedMessageError(f"end from unknown source {source_id!r}")
        if state.held and isinstance(last_seq, int):
            state.end_seq = last_seq  # resent batches may still come after the end
            return
        if isinstance(last_seq, int) and last_seq >= state.next_seq:
            self._record_gap(state, state.next_seq, last_seq, -1, "lost before the end")
            state.next_seq = last_seq + 1
        state.ended = True
        state.progress_dirty = True
        self.flush()  # the publisher waits for "on disk" before it closes

    def _on_source_lost(self, head: dict[str, Any]) -> None:
        """The supervisor saw a source process die: say so in /gaps and stop waiting for it."""
        source_id = head.get("source_id")
        state = self._sources.get(source_id) if isinstance(source_id, str) else None
        if state is None:
            raise MalformedMessageError(f"source_lost for unknown source {source_id!r}")
        reason = str(head.get("reason", "source lost"))[:128]
        self._gaps.append(Gap(state.desc.source_id, reason, state.next_seq, -1,
                              state.last_t_ns, time.monotonic_ns()))
        state.gaps += 1
        state.held, state.held_rows, state.resync = [], 0, False
        self._resyncing.discard(state.desc.source_id)
        state.ended = True
        state.progress_dirty = True

    def _on_hello(self, identity: bytes, head: dict[str, Any], host: str | None) -> None:
        """A publisher names its streams (it stalled): a resumed stream asks it to resend."""
        sources = head.get("sources")
        if not isinstance(sources, list) or len(sources) > MAX_ANNOUNCED_SOURCES:
            raise MalformedMessageError("hello needs a list of at most 1000 stream names")
        for source_id in sources:
            state = self._sources.get(source_id) if isinstance(source_id, str) else None
            if state is None or state.host != host or not state.resync or state.held:
                continue
            state.identity = identity
            self._send_to(state, message.encode_reply(resend=source_id, from_seq=state.next_seq))

    def _on_control(self, identity: bytes, head: dict[str, Any], host: str | None = None) -> None:
        command = head.get("command")
        rid = head.get("rid")
        if command == "sync":
            self._reply(identity, rid=rid)
        elif command == "status":
            self._reply(identity, rid=rid, **self.status())
        elif command == "hello":
            self._on_hello(identity, head, host)
        elif command == "source_lost":
            self._on_source_lost(head)
            self._reply(identity, rid=rid)
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

        sender = cat(4) if state.host is not None else None
        values = cat(2)
        if self._metrics is not None:
            self._feed_metrics(state, cat(0), values, sender)
        if self.config.test_write_delay_s > 0:
            time.sleep(self.config.test_write_delay_s)
        self.writer.append(state.desc.source_id, cat(0), cat(1), values, cat(3),
                           t_sender_ns=sender)
        self._bytes_since_flush += values.nbytes
        state.progress_dirty = True

    def _feed_metrics(self, state: _SourceState, t_ns: npt.NDArray[np.int64],
                      values: npt.NDArray[Any], sender: npt.NDArray[np.int64] | None) -> None:
        assert self._metrics is not None
        self._metrics.add_rows(state.desc.source_id, t_ns, values)
        if sender is not None and state.host is not None and len(t_ns):
            self._metrics.set_clock_offset(state.host, float(sender[-1] - t_ns[-1]))

    def flush(self) -> None:
        """Write everything pending, say in /progress how far each source is, confirm it."""
        news = self._has_news()
        for state in self._sources.values():
            self._write_pending(state)
        # a /progress row vouches for rows: a full disk must fail before it is written
        self.writer.flush_rows()
        if self._markers:
            self.writer.add_markers(self._markers)
            self._markers = []
        if self._gaps:
            self.writer.add_gaps(self._gaps)
            self._gaps = []
        dirty = [s for s in self._sources.values() if s.progress_dirty]
        if self._metrics is not None:
            for state in self._sources.values():
                self._metrics.set_gaps(state.desc.source_id, state.gaps)
        if dirty:
            self.writer.add_progress([(s.desc.source_id, s.next_seq, s.rows, s.ended)
                                      for s in dirty])
        if not self.writer.swmr and time.monotonic() - self._started > self.config.swmr_after_s:
            self.writer.start_swmr()
        elif not news:
            return  # nothing new: an HDF5 flush costs CPU even then
        self._new_objects = False
        self.writer.flush()
        self._bytes_since_flush = 0
        for state in dirty:
            state.progress_dirty = False
            if state.identity is not None and state.next_seq > state.acked_seq:
                state.acked_seq = state.next_seq
                self._send_to(state, message.encode_reply(durable=state.desc.source_id,
                                                          seq_next=state.next_seq))

    def _send_to(self, state: _SourceState, frames: list[Any]) -> None:
        """A message to the publisher of a stream, on the socket it came in on."""
        if state.identity is None:
            return
        sock = self._socket if state.host is None else self._remote
        if sock is not None:
            sock.send_multipart([state.identity, *frames])

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
                    "held": len(s.held),
                }
                for sid, s in self._sources.items()
            },
            "rejected": self.rejected,
            "last_rejection": self.last_rejection,
            "swmr": self.writer.swmr,
            "hosts": self._hosts_status(),
            "refused_peers": self._curve.refused if self._curve is not None else 0,
            "listen": self.listen_endpoint,
            "resumed": self.config.resume,
        }

    def _hosts_status(self) -> dict[str, Any]:
        hosts: dict[str, Any] = {}
        for host, tracker in self._pinger.trackers.items():
            hosts[host] = {
                "sources": sorted(s for s, st in self._sources.items() if st.host == host),
                "announced": self._pinger.announced.get(host),
                "clock": tracker.summary(),
                "held": len(self._held.get(host, [])),
            }
        return hosts

    # ---- main loop ----------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop without a control client (SIGTERM): drain, close, exit."""
        if self._stop_requested is None:
            self._stop_requested = (b"", "")
            self._drain_deadline = time.monotonic() + self.config.drain_timeout_s

    def _drained(self) -> bool:
        all_ended = all(s.ended for s in self._sources.values())
        return all_ended or time.monotonic() >= self._drain_deadline

    def _has_news(self) -> bool:
        """Whether anything is not flushed yet: rows, markers, gaps, progress, new streams."""
        return (self._new_objects or bool(self._markers or self._gaps)
                or any(s.pending or s.progress_dirty for s in self._sources.values()))

    def _unflushed(self) -> bool:
        """Whether a flush has work: news, or SWMR still to start."""
        return self._has_news() or not self.writer.swmr

    def run(self) -> dict[str, Any]:
        """Receive and write until a stop request has been drained; returns final status.

        What arrives is flushed at once if the last flush is ``flush_interval_s`` old, else
        when it is. With nothing to write and nothing timed due the loop sleeps until a
        message comes or the session ends (its pidfd), so a source that sends every few
        seconds costs one wake-up each time and an idle recording none.
        """
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        if self._remote is not None:
            poller.register(self._remote, zmq.POLLIN)
        parent_fd = self._watch_parent()
        poll_parent = bool(self.config.parent_pid) and parent_fd is None
        if parent_fd is not None:
            poller.register(parent_fd, zmq.POLLIN)
        interval_s = self.config.flush_interval_s
        last_flush = time.monotonic()
        try:
            while True:
                ready = dict(poller.poll(self._wait_ms(last_flush, poll_parent)))
                if parent_fd is not None and parent_fd in ready:
                    poller.unregister(parent_fd)  # readable from now on: watched once
                    os.close(parent_fd)
                    parent_fd = None
                if self._remote is not None and self._remote in ready:
                    self._receive_remote(self._remote)
                if self._socket in ready:
                    for _ in range(RECV_BURST):
                        try:
                            frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self.handle(frames)
                if self._remote is not None and not self._finish_sent:
                    self._pinger.send_due(self._send_remote)
                if self.config.parent_pid and os.getppid() != self.config.parent_pid:
                    self.request_stop()  # the session died: close the file cleanly
                if self._stop_requested is not None and not self._finish_sent:
                    self._finish_sent = True
                    self._pinger.finish_all(self._send_remote)
                if self._resyncing:
                    self._check_resync()
                now = time.monotonic()
                if self._bytes_since_flush >= FLUSH_BYTES or (
                        now >= last_flush + interval_s and self._unflushed()):
                    self.flush()
                    last_flush = now
                if self._stop_requested is not None and self._drained():
                    break
        finally:
            if parent_fd is not None:
                os.close(parent_fd)
        return self._finish()

    def _watch_parent(self) -> int | None:
        """A pidfd that ends the loop's sleep when the session ends.

        None: no session to watch, or no pidfds here (then the loop looks every
        ``IDLE_WAKE_MS``).
        """
        if not self.config.parent_pid:
            return None
        try:
            return open_pidfd(self.config.parent_pid)
        except ProcessLookupError:
            self.request_stop()  # the session is gone already
            return None

    def _wait_ms(self, last_flush: float, poll_parent: bool) -> int | None:
        """How long the loop may sleep before its next timed duty (None: until woken)."""
        now = time.monotonic()
        due = [now + IDLE_WAKE_MS / 1000] if poll_parent else []
        if self._resyncing:
            due.append(now + RESYNC_WAKE_MS / 1000)
        if self._unflushed():
            due.append(last_flush + self.config.flush_interval_s)
        if self._stop_requested is not None:
            due.append(self._drain_deadline)
        probe_ns = self._pinger.next_due_ns()
        if probe_ns is not None:
            due.append(probe_ns / 1e9)
        return None if not due else max(0, math.ceil((min(due) - now) * 1000))

    def _receive_remote(self, sock: zmq.Socket[Any]) -> None:
        """Each message is stamped on arrival (clock replies need t4) and named by its key."""
        for _ in range(RECV_BURST):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            t_recv_ns = time.monotonic_ns()
            try:
                host = frames[-1].get("User-Id")
            except (zmq.ZMQError, AttributeError):
                host = None
            if not host or host == "unknown":
                self._reject(frames[0].bytes, "remote peer without an authenticated name")
                continue
            self.handle(frames, host=str(host), t_recv_ns=t_recv_ns)

    def _finish(self) -> dict[str, Any]:
        for source_id in list(self._resyncing):
            self._give_up_resync(self._sources[source_id])
        for host, held in self._held.items():
            lost = len(held) + self._held_lost.get(host, 0)
            self._gaps.append(Gap(f"{host}.clock", f"host {host} never answered a clock probe; "
                                  f"{lost} message(s) dropped"[:128]))
        self._held.clear()
        for state in self._sources.values():
            if not state.ended:
                self._record_gap(state, state.next_seq, -1, -1, "source did not end cleanly")
        for source_id, orphans in self._orphans.items():
            self._gaps.append(Gap(source_id, "never described; batches dropped",
                                  samples_lost=sum(b.n for _, b in orphans)))
        self.flush()
        final = self.status()
        trackers = {h: t for h, t in self._pinger.trackers.items() if t.ready}
        remaps: dict[str, Callable[[Any], Any]] = {
            sid: trackers[s.host].to_local_ns for sid, s in self._sources.items()
            if s.host is not None and s.host in trackers}
        sync = {h: (t.rows(), _plain(t.summary())) for h, t in trackers.items()}
        self.writer.close({
            "session_end_monotonic_ns": time.monotonic_ns(),
            "recorder_status_json": json.dumps(final, sort_keys=True),
        }, sync=sync, remaps=remaps)
        free_reserve(self.config.output)
        if self._exporter is not None:
            self._exporter.close()
        if self._stop_requested is not None and self._stop_requested[0]:
            identity, rid = self._stop_requested
            self._peer_socket = self._socket
            self._reply(identity, rid=rid, stopped=True, **final)
        self._socket.close()
        if self._remote is not None:
            self._remote.close(0)
            if self._curve is not None:
                self._curve.stop()
            if self._remote_context is not None:
                self._remote_context.term()
        return final


def _seq_of(item: SampleBatch | Gap) -> int:
    return item.seq if isinstance(item, SampleBatch) else item.seq_first


def hosts_ready(status: dict[str, Any], hosts: list[str], min_probes: int = 3) -> bool:
    """Every named agent has announced its streams, each was acknowledged, clock known."""
    known = status.get("hosts", {})
    for host in hosts:
        info = known.get(host)
        if not info or info.get("announced") is None:
            return False
        if not set(info["announced"]) <= set(info["sources"]):
            return False
        if info["clock"].get("windows", 0) < 1 or info["clock"]["probes"] < min_probes:
            return False
    return True


def _plain(summary: dict[str, Any]) -> dict[str, Any]:
    """HDF5 attributes: numbers and strings only."""
    return {k: v for k, v in summary.items() if isinstance(v, int | float | str)}


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
    try:
        recorder.run()
    except (OSError, RuntimeError, WattlabError) as e:
        error = disk_full_error(e)
        if error is None:
            raise
        recorder.stop_for_full_disk(error)
    return 0

