"""The recorder: receives every source's messages and writes the run file.

Small messages are coalesced per source and written in large slices (one HDF5 write per
source every flush interval or every ``COALESCE_ROWS`` rows), which is what lets the
recorder keep up with many fast sources. Every sequence gap it sees becomes a row in
``/gaps``; a malformed message is rejected, counted and logged (at most a line a second per
kind), and the session goes on. A local stream's messages are taken only from the client
that described it, and one client's floods are bounded (``limits``): a second client
cannot drop, overwrite or stop another's rows (docs/reliability.md, threat model).

Remote agents (``listen``) reach a second ROUTER socket that speaks CURVE only and asks a
ZAP authenticator about every peer. Each remote message carries its peer's name (the key
file's name, ZeroMQ ``User-Id``); a peer may only send streams named ``<name>.*``, never
control the session, and its times are mapped onto this host's clock by the clock service
before they are written (and once more, with the final model, at close).

The ``Recorder`` here routes and runs the loop; the work is done by its collaborators:
``sockets`` (the two ROUTER sockets), ``stream_order`` (sequence order, resync after a
restart), ``remote_clocks`` (agents' clocks), ``gap_book`` (the /gaps rows),
``flushing`` (rows onto disk, ``durable`` answers) and ``status`` (what it reports).
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
from typing import TYPE_CHECKING, Any

import zmq

from wattlab.errors import MalformedMessageError, WattlabError
from wattlab.exit_watch import open_pidfd
from wattlab.runfile import (
    RECORDER_HOST,
    RECORDER_STATUS_JSON,
    SESSION_END_MONOTONIC_NS,
    stop_attrs,
)
from wattlab.samples import Marker, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.recorder.admission.gate import Gate
from wattlab.sync.recorder.admission.refusals import Refusals, Refused
from wattlab.sync.recorder.config import RecorderConfig
from wattlab.sync.recorder.disk_full import SealRequest, disk_full_error, stop_recording
from wattlab.sync.recorder.flushing import Flusher, open_run_file
from wattlab.sync.recorder.gap_book import GapBook
from wattlab.sync.recorder.remote_clocks import RemoteClocks
from wattlab.sync.recorder.sockets import RecorderSockets
from wattlab.sync.recorder.source_state import SourceState
from wattlab.sync.recorder.status import recorder_status, start_exporter
from wattlab.sync.recorder.stream_order import StreamOrder

if TYPE_CHECKING:
    from wattlab.sync.recorder.prometheus import Exporter

# without a pidfd for the session (the parent): look this often whether it is still there;
# each wake-up costs CPU (issue 10), and a dead session is rare and noticed soon enough
IDLE_WAKE_MS = 2000
RESYNC_WAKE_MS = 500  # while a resumed source is due to resend: look at its deadline this often
REMOTE_CONTROL = ("sync", "hello")


class Recorder:
    """Binds the bus, writes the file; ``run()`` returns when told to stop and drained.

    It decides what each message means and whether its peer may send it, then hands it to
    the collaborator whose job it is.
    """

    def __init__(self, config: RecorderConfig, context: zmq.Context[Any] | None = None) -> None:
        self.config = config
        self._context = context or zmq.Context.instance()
        self._sockets = RecorderSockets(self._context)
        self._exporter: Exporter | None = None
        try:
            self._sockets.bind(config)
            self._metrics, self._exporter = start_exporter(config.prometheus)
            self.writer, points = open_run_file(config)
        except (zmq.ZMQError, WattlabError):
            if self._exporter is not None:
                self._exporter.close()
            self._sockets.close(at_once=True)
            raise
        self.rejected = 0
        self.last_rejection = ""
        self._refusals = Refusals()
        self._sources: dict[str, SourceState] = {}
        self._gate = Gate(self._sources, self._refusals, self.writer)
        self._gaps = GapBook()
        self._clocks = RemoteClocks(config.clock_interval_s, config.clock_window_s,
                                    self._sockets.send_remote, self._reject)
        self._flusher = Flusher(self.writer, config, sources=self._sources, gaps=self._gaps,
                                sockets=self._sockets, metrics=self._metrics)
        self._order = StreamOrder(self._sources, self._gaps, self._flusher, self._clocks,
                                  self._sockets, refusals=self._refusals)
        self._stop_requested: tuple[bytes, str] | None = None
        self._stop_attrs: dict[str, str] = {}  # what the session's stop adds to the file
        self._drain_deadline_s = 0.0
        if config.resume:
            self._flusher.resume(points)

    def stop_for_full_disk(self, error: str) -> None:
        """Stop at the first full-disk error: answer a pending stop, then finish the file.

        Never returns: the process becomes ``wattlab.sync.recorder.disk_full``. Nothing is written
        through this process's HDF5 handles any more.
        """
        failed_at_ns = time.monotonic_ns()
        if self._stop_requested is not None and self._stop_requested[0]:
            identity, rid = self._stop_requested
            self._sockets.reply_local(identity, rid=rid, stopped=False, disk_full=error)
        self._context.destroy(linger=1000)  # the reply leaves before exec
        stop_recording(SealRequest(self.config.output, self.config.session_start_ns,
                                   failed_at_ns, error))

    @property
    def listen_endpoint(self) -> str:
        """Where agents connect (with the port the OS chose for ``:0``)."""
        return self._sockets.listen_endpoint

    # ---- message handling -------------------------------------------------------------
    def _reject(self, identity: bytes, reason: str, kind: str = "malformed message(s)") -> None:
        """Count and (at most once a second per kind) log a message the recorder refused."""
        self.rejected += 1
        self.last_rejection = reason
        self._refusals.note(kind, identity, reason)

    def handle(self, frames: list[Any], host: str | None = None, t_recv_ns: int = 0) -> None:
        """One message; ``host`` is the authenticated name of a remote peer (None: local)."""
        identity = bytes(frames[0])
        body = frames[1:]
        self._sockets.answer_on(remote=host is not None)
        try:
            head = message.decode_header(body)
            if host is not None:
                self._handle_remote(identity, host, head, body, t_recv_ns)
                return
            kind = head["type"]
            if kind in ("descriptor", "batch", "gap", "end"):
                self._gate.local_source(identity, head)
            if kind == "batch":
                self._order.on_batch(identity, message.decode_batch(head, body))
            elif kind == "descriptor":
                self._on_descriptor(identity, message.decode_descriptor(head))
            elif kind == "marker":
                self._add_marker(identity, message.decode_marker(head))
            elif kind == "gap":
                self._order.on_gap(message.decode_gap(head), identity)
            elif kind == "end":
                self._order.on_end(head["source"], message.decode_end(head))
            elif kind == "control":
                self._on_control(identity, head)
            else:
                raise MalformedMessageError(f"message type {kind!r} is not for the recorder")
        except Refused as e:
            self._reject(identity, str(e), e.kind)
        except MalformedMessageError as e:
            self._reject(identity, str(e))

    def _add_marker(self, identity: bytes, marker: Marker) -> None:
        self._gate.marker_rate(identity, marker)
        self._flusher.markers.append(marker)

    def _handle_remote(self, identity: bytes, host: str, head: dict[str, Any], body: list[Any],
                       t_recv_ns: int) -> None:
        kind = head["type"]
        source = head["source"]
        if kind == "clock":
            self._clocks.on_clock(identity, host, head, t_recv_ns)
        elif kind == "control":
            if head.get("command") not in REMOTE_CONTROL:
                raise MalformedMessageError(
                    f"host {host!r} may not send control command {head.get('command')!r}")
            self._on_control(identity, head, host)
        elif kind == "descriptor":
            self._gate.remote_source(host, source)
            self._on_descriptor(identity, message.decode_descriptor(head), host)
        elif kind == "marker":
            marker = message.decode_marker(head)
            if marker.source != host and not marker.source.startswith(f"{host}."):
                raise MalformedMessageError(
                    f"host {host!r} sent a marker for source {marker.source!r}")
            self._gate.marker_rate(host, marker)
            self._clocks.when_clock(host, lambda: self._flusher.markers.append(
                self._clocks.marker_to_local(host, marker)))
        elif kind in ("batch", "gap", "end"):
            self._gate.remote_source(host, source)
            if kind == "batch":
                batch = message.decode_batch(head, body)
                self._clocks.when_clock(host, lambda: self._order.on_batch(identity, batch))
            elif kind == "gap":
                gap = message.decode_gap(head)
                self._clocks.when_clock(
                    host, lambda: self._order.on_gap(self._clocks.gap_to_local(host, gap)))
            else:
                last_seq = message.decode_end(head)
                self._clocks.when_clock(host, lambda: self._order.on_end(source, last_seq))
        else:
            raise MalformedMessageError(f"message type {kind!r} is not for the recorder")

    def _on_descriptor(
        self, identity: bytes, desc: SourceDescriptor, host: str | None = None
    ) -> None:
        if desc.source_id not in self._sources:
            self._gate.new_stream(identity if host is None else host, desc.source_id)
        self._flusher.add_source(desc, host)
        self._order.on_descriptor(identity, desc, host)
        if set(self.config.expected_sources) <= set(self._sources):
            self.writer.start_swmr()

    def _on_control(self, identity: bytes, head: dict[str, Any], host: str | None = None) -> None:
        command = head.get("command")
        rid = head.get("rid")
        if command == "sync":
            self._sockets.reply(identity, rid=rid)
        elif command == "status":
            self._sockets.reply(identity, rid=rid, **self.status())
        elif command == "hello":
            self._order.on_hello(identity, head, host)
        elif command == "source_lost":
            self._order.on_source_lost(head)
            self._sockets.reply(identity, rid=rid)
        elif command == "stop":
            self._stop_requested = (identity, str(rid))
            self._stop_attrs = stop_attrs(head, host)
            self._drain_deadline_s = time.monotonic() + self.config.drain_timeout_s
        else:
            raise MalformedMessageError(f"unknown control command {command!r}")

    def flush(self) -> None:
        """Write everything pending, say in /progress how far each source is, confirm it."""
        for gap in self._refusals.take_gaps():
            self._gaps.add(gap)
        self._flusher.flush()

    def status(self) -> dict[str, Any]:
        return recorder_status(self.config, self._sources, writer=self.writer,
                               clocks=self._clocks, sockets=self._sockets,
                               rejected=self.rejected, last_rejection=self.last_rejection,
                               refused=self._refusals.status())

    # ---- main loop ----------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop without a control client (SIGTERM): drain, close, exit."""
        if self._stop_requested is None:
            self._stop_requested = (b"", "")
            self._drain_deadline_s = time.monotonic() + self.config.drain_timeout_s

    def _drained(self) -> bool:
        all_ended = all(s.ended for s in self._sources.values())
        return all_ended or time.monotonic() >= self._drain_deadline_s

    def run(self) -> dict[str, Any]:
        """Receive and write until a stop request has been drained; returns final status.

        What arrives is flushed ``GATHER_S`` (20 ms) later if the last flush is
        ``flush_interval_s`` old (the rest of a source's burst joins the same flush), else
        when it is. With nothing to write and nothing timed due the loop sleeps until a
        message comes or the session ends (its pidfd), so a source that sends every few
        seconds costs one wake-up each time and an idle recording none.
        """
        poller = zmq.Poller()
        self._sockets.register(poller)
        remote = self._sockets.remote
        parent_fd = self._watch_parent()
        poll_parent = bool(self.config.parent_pid) and parent_fd is None
        if parent_fd is not None:
            poller.register(parent_fd, zmq.POLLIN)
        last_flush_s = time.monotonic()
        try:
            while True:
                ready = dict(poller.poll(self._wait_ms(last_flush_s, poll_parent)))
                if parent_fd is not None and parent_fd in ready:
                    poller.unregister(parent_fd)  # readable from now on: watched once
                    os.close(parent_fd)
                    parent_fd = None
                if remote is not None and remote in ready:
                    self._receive_remote()
                if self._sockets.local in ready:
                    for frames in self._sockets.local_messages():
                        self.handle(frames)
                if remote is not None:
                    self._clocks.send_due()
                if self.config.parent_pid and os.getppid() != self.config.parent_pid:
                    self.request_stop()  # the session died: close the file cleanly
                if self._stop_requested is not None:
                    self._clocks.send_finish()
                if self._order.resyncing:
                    self._order.check_resync()
                now_s = time.monotonic()
                if self._flusher.due(now_s, last_flush_s):
                    self.flush()
                    last_flush_s = now_s
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

    def _wait_ms(self, last_flush_s: float, poll_parent: bool) -> int | None:
        """How long the loop may sleep before its next timed duty (None: until woken)."""
        now_s = time.monotonic()
        due_s = [now_s + IDLE_WAKE_MS / 1000] if poll_parent else []
        if self._order.resyncing:
            due_s.append(now_s + RESYNC_WAKE_MS / 1000)
        if self._flusher.unflushed():
            due_s.append(self._flusher.flush_at_s(last_flush_s))
        if self._stop_requested is not None:
            due_s.append(self._drain_deadline_s)
        probe_ns = self._clocks.next_due_ns()
        if probe_ns is not None:
            due_s.append(probe_ns / 1e9)
        return None if not due_s else max(0, math.ceil((min(due_s) - now_s) * 1000))

    def _receive_remote(self) -> None:
        """Only a peer with an authenticated name (its key's) is heard."""
        for frames, host, t_recv_ns in self._sockets.remote_messages():
            if host is None:
                self._reject(frames[0].bytes, "remote peer without an authenticated name")
                continue
            self.handle(frames, host=host, t_recv_ns=t_recv_ns)

    def _finish(self) -> dict[str, Any]:
        self._order.give_up_all()
        for gap in self._clocks.drop_held():
            self._gaps.add(gap)
        self._order.finish()
        self.flush()
        self._refusals.log.flush_lines()
        final = self.status()
        sync, remaps = self._clocks.final_models(self._sources)
        self._flusher.close({
            SESSION_END_MONOTONIC_NS: time.monotonic_ns(),
            RECORDER_STATUS_JSON: json.dumps(final, sort_keys=True),
            **self._stop_attrs,
        }, sync, remaps)
        if self._exporter is not None:
            self._exporter.close()
        if self._stop_requested is not None and self._stop_requested[0]:
            identity, rid = self._stop_requested
            self._sockets.reply_local(identity, rid=rid, stopped=True, **final)
        self._sockets.close()
        return final


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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the recorder process the session starts."""
    parser = argparse.ArgumentParser(prog="wattlab-recorder")
    parser.add_argument("config_json")
    args = parser.parse_args(argv)
    # Ctrl-C reaches the whole process group; the session decides when the recorder stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    config = RecorderConfig(**json.loads(args.config_json))
    config.root_attrs.setdefault(RECORDER_HOST, socket.gethostname())
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
