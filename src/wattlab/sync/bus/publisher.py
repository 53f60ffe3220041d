"""The bus: sources (DEALER) connect to the recorder (ROUTER).

Why DEALER/ROUTER and not PUB/SUB: PUB drops everything sent before a subscriber joins
(the slow-joiner problem) and whenever it falls behind; a DEALER queues messages until the
recorder is there, and the ROUTER can talk back (acks, "describe yourself again" after a
recorder restart), which is the start handshake. Arrays are sent without copies.

The ``BusPublisher`` here takes a source's messages and answers the recorder; its
collaborators are ``dealer`` (the socket and how it sends), ``outbox`` (what waits to be
sent, drops, the pump) and ``replay_window`` (what is kept until it is on disk).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import zmq

from wattlab.errors import BusError
from wattlab.samples import Gap, Marker, SampleBatch, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.bus.coalesce import Coalescer
from wattlab.sync.bus.dealer import DealerSocket
from wattlab.sync.bus.outbox import Outbox
from wattlab.sync.bus.replay_window import ReplayWindow
from wattlab.sync.bus.security import ClientSecurity

# bytes a publisher keeps for replay until the recorder has them on disk
DEFAULT_WINDOW_BYTES = 16 * 1024 * 1024
# how often a publisher that is only coalescing looks for the recorder's requests
SERVE_EVERY_S = 0.01
# ... and one that had nothing to send (a slow source between reads)
IDLE_SERVE_EVERY_S = 0.5
_ENDPOINT_SECURITY: dict[str, ClientSecurity] = {}


def set_endpoint_security(endpoint: str, security: ClientSecurity | None) -> None:
    """Every BusPublisher to ``endpoint`` in this process uses these CURVE keys.

    Why a registry: sources build their own publisher from an endpoint string (one per
    thread), so the agent states once how to reach its recorder and every runner follows.
    """
    if security is None:
        _ENDPOINT_SECURITY.pop(endpoint, None)
    else:
        _ENDPOINT_SECURITY[endpoint] = security


def endpoint_security(endpoint: str) -> ClientSecurity | None:
    return _ENDPOINT_SECURITY.get(endpoint)


_ENDPOINT_FOLDERS: dict[str, int] = {}  # folder -> the pid that made it


@atexit.register
def _remove_endpoint_folders() -> None:
    """At exit, the folders this process made (a forked child leaves its parent's alone)."""
    for folder, pid in _ENDPOINT_FOLDERS.items():
        if pid == os.getpid():
            shutil.rmtree(folder, ignore_errors=True)


def local_endpoint() -> str:
    """A fresh local endpoint (ipc in a private temp dir) so sessions never collide.

    Its folder is removed when this process exits at the latest (``private_endpoint``
    removes it sooner): a caller that forgets must not leave a folder in /tmp per call.
    """
    folder = tempfile.mkdtemp(prefix="wattlab-")
    _ENDPOINT_FOLDERS[folder] = os.getpid()
    return f"ipc://{os.path.join(folder, 'bus.sock')}"


@contextlib.contextmanager
def private_endpoint() -> Iterator[str]:
    """A local endpoint whose folder is removed at the end.

    A lab machine that records all day must not collect a folder in /tmp per session.
    """
    endpoint = local_endpoint()
    try:
        yield endpoint
    finally:
        folder = os.path.dirname(endpoint.removeprefix("ipc://"))
        shutil.rmtree(folder, ignore_errors=True)
        _ENDPOINT_FOLDERS.pop(folder, None)


class BusPublisher:
    """Sends one or more sources' messages to a recorder; one per thread (zmq rule).

    Every batch stays in a replay *window* until the recorder says it is on disk
    (``durable`` after each flush); a recorder restarted after a crash asks for what it
    lacks (``resend``) and gets it from there, so its crash loses nothing. The window is
    bounded (``window_bytes``): when it is full the publisher either waits for the recorder
    (``backlog_bytes=None``: backpressure onto the caller, as a benchmark wants) or keeps
    later messages in a bounded backlog and, beyond ``backlog_bytes``, drops batches and
    sends one gap message saying exactly which sequence numbers and how many rows were
    lost (what a source reading an instrument wants: never block the reader).
    """

    def __init__(
        self, endpoint: str, context: zmq.Context[Any] | None = None, linger_ms: int = 10_000,
        security: ClientSecurity | None = None, coalesce_rows: int = 0, *,
        window_bytes: int = DEFAULT_WINDOW_BYTES, backlog_bytes: int | None = None,
    ) -> None:
        """Connect a DEALER to ``endpoint`` (with CurveZMQ keys where given).

        ``coalesce_rows`` > 0 joins a source's consecutive batches up to that many rows;
        they leave on ``flush()`` (call it after each read), on any other message, or when
        full.
        """
        self.endpoint = endpoint
        self._socket = DealerSocket(endpoint, context or zmq.Context.instance(), linger_ms,
                                    security or endpoint_security(endpoint),
                                    blocking=backlog_bytes is None)
        self._descriptors: dict[str, SourceDescriptor] = {}
        self._acked: set[str] = set()
        self.acked_seq_next: dict[str, int] = {}
        self._linger_s = linger_ms / 1000 if linger_ms >= 0 else 3600.0
        self._replies: dict[str, dict[str, Any]] = {}
        self._coalescer = Coalescer(coalesce_rows) if coalesce_rows > 0 else None
        self._window = ReplayWindow(window_bytes)
        self._outbox = Outbox(self._socket, self._window, backlog_bytes, self.serve_requests)
        self._next_serve_s = 0.0

    @property
    def dropped_batches(self) -> int:
        """Batches dropped unsent because the backlog was full (each reported as a gap)."""
        return self._outbox.dropped_batches

    @property
    def dropped_rows(self) -> int:
        return self._outbox.dropped_rows

    @property
    def resent_batches(self) -> int:
        """Batches sent again to a recorder restarted after a crash."""
        return self._window.resent_batches

    # ---- sending ---------------------------------------------------------------------------
    def _queue_coalesced(self) -> None:
        """Queue the batches held back for coalescing."""
        if self._coalescer is not None:
            for item in self._coalescer.take_all():
                self._outbox.queue_batch(item)

    def announce(self, desc: SourceDescriptor) -> None:
        """Tell the recorder what a source is; resent whenever the recorder asks."""
        self.flush()
        self._descriptors[desc.source_id] = desc
        self._window.stream(desc.source_id)
        self._outbox.queue(message.encode_descriptor(desc))
        self._outbox.pump()

    def send_batch(self, batch: SampleBatch) -> None:
        if batch.source_id not in self._descriptors:
            raise BusError(f"source {batch.source_id!r} sends data before announcing itself")
        ready = [batch] if self._coalescer is None else self._coalescer.add(batch)
        for item in ready:
            self._outbox.queue_batch(item)
        if ready or self._outbox:
            self._outbox.pump()
        elif time.monotonic() >= self._next_serve_s:
            # a batch held for coalescing sends nothing: look for requests now and then,
            # not on every batch (a poll is a system call; acks come per flush anyway)
            self._next_serve_s = time.monotonic() + SERVE_EVERY_S
            self.serve_requests()

    def flush(self) -> None:
        """Send the batches held back for coalescing, answer the recorder, drain the backlog."""
        self._queue_coalesced()
        self._outbox.pump()

    def idle(self) -> None:
        """Nothing new to send: pump what the pipe refused, answer the recorder now and then.

        A source that wakes ten times a second to read a GPU would otherwise pay a socket
        poll per wake; the recorder's acks and requests can wait half a second.
        """
        if self._outbox or (self._coalescer is not None and self._coalescer.pending):
            self.flush()
        elif time.monotonic() >= self._next_serve_s:
            self._next_serve_s = time.monotonic() + IDLE_SERVE_EVERY_S
            self.serve_requests()

    def send_marker(self, marker: Marker) -> None:
        self.flush()
        self._outbox.queue(message.encode_marker(marker))
        self._outbox.pump()

    def send_gap(self, gap: Gap) -> None:
        self.flush()
        self._outbox.queue(message.encode_gap(gap))
        self._outbox.pump()

    def end(self, source_id: str, last_seq: int) -> None:
        """Say a source has finished, so the recorder knows nothing more is coming."""
        self.flush()
        self._outbox.queue(message.encode_end(source_id, last_seq))
        self._outbox.pump()

    # ---- the recorder's requests -------------------------------------------------------------
    def serve_requests(self) -> None:
        """Answer the recorder's requests (acks, re-describe, resend) without blocking."""
        while self._socket.poll(0):
            frames = self._socket.receive()
            try:
                head = message.decode_header(frames)
            except BusError:
                continue
            if head.get("ack") in self._descriptors:
                self._acked.add(head["ack"])
                if isinstance(head.get("next_seq"), int):
                    self.acked_seq_next[head["ack"]] = head["next_seq"]
            if isinstance(head.get("rid"), str):
                self._replies[head["rid"]] = head
            wanted = head.get("describe")
            if isinstance(wanted, str) and wanted in self._descriptors:
                self._outbox.push_front(message.encode_descriptor(self._descriptors[wanted]))
            durable = head.get("durable")
            if isinstance(durable, str) and isinstance(head.get("seq_next"), int):
                self._window.on_durable(durable, head["seq_next"])
            resend = head.get("resend")
            if isinstance(resend, str) and isinstance(head.get("from_seq"), int):
                front = self._window.resend(resend, head["from_seq"],
                                            self._outbox.first_queued_seq)
                for frames in reversed(front):
                    self._outbox.push_front(frames)

    def durable_seq(self, source_id: str) -> int:
        """The next sequence number of a stream not yet confirmed on disk by the recorder."""
        return self._window.durable_seq(source_id)

    def wait_ready(self, timeout_s: float) -> None:
        """The start handshake: block until the recorder acknowledged every descriptor."""
        deadline = time.monotonic() + timeout_s
        while not set(self._descriptors) <= self._acked:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                missing = sorted(set(self._descriptors) - self._acked)
                raise BusError(f"no recorder acknowledged {missing} at {self.endpoint}")
            self._outbox.pump()
            if self._socket.poll(min(left_ms, 50)):
                self.serve_requests()

    def sync(self, timeout_s: float) -> bool:
        """Block until the recorder has received everything sent so far (FIFO per pipe).

        A closed socket alone does not guarantee delivery: a process that exits without
        terminating its ZeroMQ context (os._exit, a forked child) drops queued messages.
        """
        deadline = time.monotonic() + timeout_s
        self._queue_coalesced()
        if not self._outbox.drain(deadline):
            return False
        rid = uuid.uuid4().hex
        if not self._socket.send_within(message.encode_control("sync", rid=rid), timeout_s):
            return False
        while rid not in self._replies:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return False
            if self._socket.poll(min(left_ms, 100)):
                self.serve_requests()
                if self._outbox and not self._outbox.drain(deadline):  # a resend was asked for
                    return False
        del self._replies[rid]
        self._socket.unsynced = False
        return True

    def wait_durable(self, timeout_s: float) -> bool:
        """Block until the recorder has every batch sent so far on disk (resending on request)."""
        deadline = time.monotonic() + timeout_s
        while self._window.used_bytes or self._outbox:
            if not self._outbox.drain(deadline):
                return False
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return False
            if self._window.used_bytes and self._socket.poll(min(left_ms, 100)):
                self.serve_requests()
        return True

    @property
    def unconfirmed_bytes(self) -> int:
        """Bytes held for the recorder: the replay window plus the unsent backlog."""
        return self._window.used_bytes + self._outbox.queued_bytes

    def close(self, wait: bool = True) -> None:
        """Close after the recorder confirmed it has everything (bounded by the linger time).

        ``wait=False``: the recorder is gone for good (it stopped on a full disk); drop what
        is queued at once.
        """
        if not wait:
            self._socket.close(linger_ms=0)
            return
        deadline = time.monotonic() + self._linger_s
        self._queue_coalesced()
        pending = self._socket.unsynced or bool(self._outbox) or self._window.used_bytes > 0
        delivered = not pending or self.sync(self._linger_s)
        if delivered and self._window.used_bytes:
            delivered = self.wait_durable(max(0.0, deadline - time.monotonic()))
        self._socket.close(linger_ms=None if delivered else 0)


class ControlClient:
    """Asks the recorder for its state or tells it to stop; request/reply over the bus."""

    def __init__(self, endpoint: str, context: zmq.Context[Any] | None = None) -> None:
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(endpoint)
        self.endpoint = endpoint

    def request(self, command: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        """Send a command and wait for the reply carrying the same request id."""
        rid = uuid.uuid4().hex
        self._socket.send_multipart(message.encode_control(command, rid=rid, **fields))
        deadline = time.monotonic() + timeout_s
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            if self._socket.poll(left_ms, zmq.POLLIN):
                head = message.decode_header(self._socket.recv_multipart())
                if head.get("rid") == rid:
                    return head
        raise BusError(f"recorder at {self.endpoint} did not answer {command!r} in {timeout_s} s")

    def close(self) -> None:
        self._socket.close(0)
