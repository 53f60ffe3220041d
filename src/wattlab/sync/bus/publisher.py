"""The bus: sources (DEALER) connect to the recorder (ROUTER).

Why DEALER/ROUTER and not PUB/SUB: PUB drops everything sent before a subscriber joins
(the slow-joiner problem) and whenever it falls behind; a DEALER queues messages until the
recorder is there, and the ROUTER can talk back (acks, "describe yourself again" after a
recorder restart), which is the start handshake. Arrays are sent without copies.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from wattlab.errors import BusError
from wattlab.samples import Gap, Marker, SampleBatch, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.bus.coalesce import Coalescer
from wattlab.sync.bus.security import ClientSecurity

DEFAULT_SEND_HWM = 100_000
# bytes a publisher keeps for replay until the recorder has them on disk
DEFAULT_WINDOW_BYTES = 16 * 1024 * 1024
# no durable ack for this long while the window is full: say hello (a restarted recorder
# learns who has its streams, and asks for what it lacks)
STALL_HELLO_S = 1.0
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


def local_endpoint() -> str:
    """A fresh local endpoint (ipc in a private temp dir) so sessions never collide."""
    folder = tempfile.mkdtemp(prefix="wattlab-")
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
        shutil.rmtree(os.path.dirname(endpoint.removeprefix("ipc://")), ignore_errors=True)


@dataclass
class _Sent:
    """A batch on the wire but not yet on disk: kept so a restarted recorder can have it."""

    source_id: str
    seq: int
    last_seq: int
    rows: int
    nbytes: int
    frames: list[Any]


@dataclass
class _Drop:
    """Consecutive batches dropped unsent (backlog full); leaves as one gap message."""

    source_id: str
    seq_first: int
    seq_last: int
    rows: int
    t_first_ns: int
    t_last_ns: int


@dataclass
class _Stream:
    """A source's replay state in this publisher."""

    window: deque[_Sent] = field(default_factory=deque)
    durable_next: int = 0
    next_seq: int = 0  # one past the last sequence number queued
    dropped: list[list[int]] = field(default_factory=list)  # [first, last, rows] not yet acked


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
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._blocking = backlog_bytes is None
        self._socket.setsockopt(zmq.SNDHWM, DEFAULT_SEND_HWM if self._blocking else 1000)
        self._socket.setsockopt(zmq.LINGER, linger_ms)
        self._socket.setsockopt(zmq.IDENTITY, uuid.uuid4().hex.encode())
        security = security or endpoint_security(endpoint)
        # over the remote bus a refused or vanished recorder must not hang a source forever
        self._send_timeout_ms = -1 if security is None else max(1000, linger_ms)
        self._socket.setsockopt(zmq.SNDTIMEO, self._send_timeout_ms)
        try:
            if security is not None:
                security.apply(self._socket)
            self._socket.connect(endpoint)
        except zmq.ZMQError as e:
            self._socket.close(0)
            raise BusError(f"cannot connect to bus endpoint {endpoint!r}: {e}") from e
        self._descriptors: dict[str, SourceDescriptor] = {}
        self._acked: set[str] = set()
        self.acked_seq_next: dict[str, int] = {}
        self._unsynced = False
        self._linger_s = linger_ms / 1000 if linger_ms >= 0 else 3600.0
        self._replies: dict[str, dict[str, Any]] = {}
        self._coalescer = Coalescer(coalesce_rows) if coalesce_rows > 0 else None
        self.window_bytes = max(1, window_bytes)
        self.backlog_bytes = backlog_bytes or 0
        self._streams: dict[str, _Stream] = {}
        self._window_used = 0
        self._outbox: deque[_Sent | _Drop | list[Any]] = deque()
        self._outbox_bytes = 0
        self.dropped_batches = 0
        self.dropped_rows = 0
        self.resent_batches = 0
        self._last_progress = time.monotonic()
        self._next_serve_s = 0.0
        self._last_hello = 0.0

    # ---- sending ---------------------------------------------------------------------------
    def _send(self, frames: list[Any]) -> None:
        """Send now, blocking (bounded by the send timeout over the remote bus)."""
        self._unsynced = True
        try:
            self._socket.send_multipart(frames, copy=False)
        except zmq.Again as e:
            raise BusError(f"bus send to {self.endpoint} timed out: is the recorder there and "
                           "does it accept this agent's key?") from e
        except zmq.ZMQError as e:
            raise BusError(f"bus send to {self.endpoint} failed: {e}") from e

    def _try_send(self, frames: list[Any]) -> bool:
        """Send without blocking (backlog mode) or blocking; False: the pipe is full."""
        if self._blocking:
            self._send(frames)
            return True
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            raise BusError(f"bus send to {self.endpoint} failed: {e}") from e
        self._unsynced = True
        return True

    def _stream(self, source_id: str) -> _Stream:
        stream = self._streams.get(source_id)
        if stream is None:
            stream = self._streams[source_id] = _Stream()
        return stream

    def _queue(self, item: _Sent | _Drop | list[Any], nbytes: int = 0) -> None:
        self._outbox.append(item)
        self._outbox_bytes += nbytes

    def _queue_batch(self, batch: SampleBatch) -> None:
        stream = self._stream(batch.source_id)
        stream.next_seq = max(stream.next_seq, batch.last_seq + 1)
        tail = self._outbox[-1] if self._outbox else None
        if isinstance(tail, _Drop) and tail.source_id == batch.source_id:
            self._drop(batch, tail)  # once dropping, keep the loss contiguous until it drains
            return
        frames = message.encode_batch(batch)
        nbytes = sum(_nbytes(f) for f in frames)
        if (not self._blocking and self._outbox
                and self._outbox_bytes + nbytes > self.backlog_bytes):
            self._drop(batch, None)
            return
        entry = _Sent(batch.source_id, batch.seq, batch.last_seq, batch.n, nbytes, frames)
        self._queue(entry, nbytes)

    def _drop(self, batch: SampleBatch, into: _Drop | None) -> None:
        """Account for a batch that cannot be kept: exact sequence range and row count."""
        self.dropped_batches += 1
        self.dropped_rows += batch.n
        t_first = int(batch.t_host_ns[0]) if batch.n else -1
        t_last = int(batch.t_host_ns[-1]) if batch.n else -1
        if into is None:
            self._queue(_Drop(batch.source_id, batch.seq, batch.last_seq, batch.n, t_first,
                              t_last))
        else:
            into.seq_last = batch.last_seq
            into.rows += batch.n
            into.t_last_ns = t_last if t_last >= 0 else into.t_last_ns
        dropped = self._stream(batch.source_id).dropped
        if dropped and dropped[-1][1] + 1 == batch.seq:
            dropped[-1][1] = batch.last_seq
            dropped[-1][2] += batch.n
        else:
            dropped.append([batch.seq, batch.last_seq, batch.n])

    def _pump(self, wait: bool = False) -> None:
        """Send what the window and the pipe allow, in order; ``wait``: block until empty."""
        self.serve_requests()
        while self._outbox:
            item = self._outbox[0]
            if isinstance(item, _Sent):
                if self._window_used and self._window_used + item.nbytes > self.window_bytes:
                    if not (self._blocking or wait):
                        self._hello_if_stalled()
                        return
                    self._wait_for_window(item.nbytes)
                    continue
                if not self._try_send(item.frames):
                    if not wait:
                        return
                    self._socket.poll(10, zmq.POLLOUT)
                    continue
                self._streams[item.source_id].window.append(item)
                self._window_used += item.nbytes
                self._outbox_bytes -= item.nbytes
            else:
                frames = self._drop_frames(item) if isinstance(item, _Drop) else item
                if not self._try_send(frames):
                    if not wait:
                        return
                    self._socket.poll(10, zmq.POLLOUT)
                    continue
            self._outbox.popleft()

    @staticmethod
    def _drop_frames(drop: _Drop) -> list[Any]:
        reason = "dropped by the source: bus backlog full (recorder too slow or away)"
        return message.encode_gap(Gap(drop.source_id, reason, drop.seq_first, drop.seq_last,
                                      drop.t_first_ns, drop.t_last_ns, drop.rows))

    def _wait_for_window(self, nbytes: int) -> None:
        """Blocking mode: wait for durable acks (the recorder flushes at least every 0.5 s)."""
        deadline = None if self._send_timeout_ms < 0 else (
            time.monotonic() + self._send_timeout_ms / 1000)
        while self._window_used and self._window_used + nbytes > self.window_bytes:
            self._hello_if_stalled()
            if deadline is not None and time.monotonic() > deadline:
                raise BusError(f"bus to {self.endpoint}: recorder confirmed nothing for "
                               f"{self._send_timeout_ms} ms; is it there?")
            if self._socket.poll(100, zmq.POLLIN):
                self.serve_requests()

    def _hello_if_stalled(self) -> None:
        """Say hello when the window is full and nothing was confirmed for a while.

        A recorder restarted after a crash knows the streams (from the file) but not which
        peer sends them, and a publisher whose window is full sends no batch it could learn
        that from; the hello names this publisher's streams so it can ask for a resend.
        """
        now = time.monotonic()
        if now - self._last_progress < STALL_HELLO_S or now - self._last_hello < STALL_HELLO_S:
            return
        self._last_hello = now
        frames = message.encode_control("hello", sources=sorted(self._streams))
        with contextlib.suppress(zmq.ZMQError):  # pipe full too: the next check tries again
            self._socket.send_multipart(frames, zmq.NOBLOCK)

    def announce(self, desc: SourceDescriptor) -> None:
        """Tell the recorder what a source is; resent whenever the recorder asks."""
        self.flush()
        self._descriptors[desc.source_id] = desc
        self._stream(desc.source_id)
        self._queue(message.encode_descriptor(desc))
        self._pump()

    def send_batch(self, batch: SampleBatch) -> None:
        if batch.source_id not in self._descriptors:
            raise BusError(f"source {batch.source_id!r} sends data before announcing itself")
        ready = [batch] if self._coalescer is None else self._coalescer.add(batch)
        for item in ready:
            self._queue_batch(item)
        if ready or self._outbox:
            self._pump()
        elif time.monotonic() >= self._next_serve_s:
            # a batch held for coalescing sends nothing: look for requests now and then,
            # not on every batch (a poll is a system call; acks come per flush anyway)
            self._next_serve_s = time.monotonic() + SERVE_EVERY_S
            self.serve_requests()

    def flush(self) -> None:
        """Send the batches held back for coalescing, answer the recorder, drain the backlog."""
        if self._coalescer is not None:
            for item in self._coalescer.take_all():
                self._queue_batch(item)
        self._pump()

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
        self._queue(message.encode_marker(marker))
        self._pump()

    def send_gap(self, gap: Gap) -> None:
        self.flush()
        self._queue(message.encode_gap(gap))
        self._pump()

    def end(self, source_id: str, last_seq: int) -> None:
        """Say a source has finished, so the recorder knows nothing more is coming."""
        self.flush()
        self._queue(message.encode_end(source_id, last_seq))
        self._pump()

    # ---- the recorder's requests -------------------------------------------------------------
    def serve_requests(self) -> None:
        """Answer the recorder's requests (acks, re-describe, resend) without blocking."""
        while self._socket.poll(0, zmq.POLLIN):
            frames = self._socket.recv_multipart()
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
                self._outbox.appendleft(message.encode_descriptor(self._descriptors[wanted]))
            durable = head.get("durable")
            if isinstance(durable, str) and isinstance(head.get("seq_next"), int):
                self._on_durable(durable, head["seq_next"])
            resend = head.get("resend")
            if isinstance(resend, str) and isinstance(head.get("from_seq"), int):
                self._on_resend(resend, head["from_seq"])

    def durable_seq(self, source_id: str) -> int:
        """The next sequence number of a stream not yet confirmed on disk by the recorder."""
        stream = self._streams.get(source_id)
        return 0 if stream is None else stream.durable_next

    def _on_durable(self, source_id: str, seq_next: int) -> None:
        stream = self._streams.get(source_id)
        if stream is None:
            return
        self._last_progress = time.monotonic()
        stream.durable_next = max(stream.durable_next, seq_next)
        while stream.window and stream.window[0].last_seq < seq_next:
            self._window_used -= stream.window.popleft().nbytes
        stream.dropped = [d for d in stream.dropped if d[1] >= seq_next]

    def _on_resend(self, source_id: str, from_seq: int) -> None:
        """A restarted recorder lacks ``from_seq`` onwards: resend it from the window.

        What is gone for good (dropped, or older than the window) is said exactly, as a gap.
        """
        stream = self._streams.get(source_id)
        if stream is None:
            return
        again = [e for e in stream.window if e.last_seq >= from_seq]
        if again:
            ends = [again[0].seq] + [e.seq for e in again[1:]]
        else:
            queued = [i for i in self._outbox if isinstance(i, _Sent | _Drop)
                      and i.source_id == source_id]
            first = queued[0] if queued else None
            ends = [stream.next_seq if first is None else
                    first.seq if isinstance(first, _Sent) else first.seq_first]
        front: list[list[Any]] = []
        expected = from_seq
        for i, upto in enumerate(ends):
            if upto > expected:  # a hole: dropped (gap message lost with the recorder) or gone
                front.append(self._hole(source_id, stream, expected, upto - 1))
            if i < len(again):
                front.append(again[i].frames)
                expected = max(expected, again[i].last_seq + 1)
        self.resent_batches += len(again)
        self._last_progress = time.monotonic()
        for frames in reversed(front):
            self._outbox.appendleft(frames)

    @staticmethod
    def _hole(source_id: str, stream: _Stream, first: int, last: int) -> list[Any]:
        """A gap message for sequence numbers no longer here, exact where they were dropped."""
        lost = [d for d in stream.dropped if d[0] >= first and d[1] <= last]
        covered = sum(d[1] - d[0] + 1 for d in lost) == last - first + 1
        rows = sum(d[2] for d in lost) if covered else -1
        reason = ("dropped by the source: bus backlog full (recorder too slow or away)"
                  if covered else "lost in a recorder restart (not in the replay window)")
        return message.encode_gap(Gap(source_id, reason, first, last, samples_lost=rows))

    def wait_ready(self, timeout_s: float) -> None:
        """The start handshake: block until the recorder acknowledged every descriptor."""
        deadline = time.monotonic() + timeout_s
        while not set(self._descriptors) <= self._acked:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                missing = sorted(set(self._descriptors) - self._acked)
                raise BusError(f"no recorder acknowledged {missing} at {self.endpoint}")
            self._pump()
            if self._socket.poll(min(left_ms, 50), zmq.POLLIN):
                self.serve_requests()

    def _drain(self, deadline: float) -> bool:
        """Send the whole backlog (blocking up to ``deadline``); False if it could not."""
        while self._outbox:
            if time.monotonic() >= deadline:
                return False
            self._pump()
            if self._outbox:
                self._socket.poll(20, zmq.POLLIN | zmq.POLLOUT)
        return True

    def sync(self, timeout_s: float) -> bool:
        """Block until the recorder has received everything sent so far (FIFO per pipe).

        A closed socket alone does not guarantee delivery: a process that exits without
        terminating its ZeroMQ context (os._exit, a forked child) drops queued messages.
        """
        deadline = time.monotonic() + timeout_s
        if self._coalescer is not None:
            for item in self._coalescer.take_all():
                self._queue_batch(item)
        if not self._drain(deadline):
            return False
        rid = uuid.uuid4().hex
        # a peer that refused us (CURVE) leaves no pipe and a plain send would block forever
        self._socket.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_s * 1000)))
        try:
            self._socket.send_multipart(message.encode_control("sync", rid=rid))
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            raise BusError(f"bus send to {self.endpoint} failed: {e}") from e
        finally:
            self._socket.setsockopt(zmq.SNDTIMEO, self._send_timeout_ms)
        while rid not in self._replies:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return False
            if self._socket.poll(min(left_ms, 100), zmq.POLLIN):
                self.serve_requests()
                if self._outbox and not self._drain(deadline):  # a resend was asked for
                    return False
        del self._replies[rid]
        self._unsynced = False
        return True

    def wait_durable(self, timeout_s: float) -> bool:
        """Block until the recorder has every batch sent so far on disk (resending on request)."""
        deadline = time.monotonic() + timeout_s
        while self._window_used or self._outbox:
            if not self._drain(deadline):
                return False
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return False
            if self._window_used and self._socket.poll(min(left_ms, 100), zmq.POLLIN):
                self.serve_requests()
        return True

    @property
    def unconfirmed_bytes(self) -> int:
        """Bytes held for the recorder: the replay window plus the unsent backlog."""
        return self._window_used + self._outbox_bytes

    def close(self, wait: bool = True) -> None:
        """Close after the recorder confirmed it has everything (bounded by the linger time).

        ``wait=False``: the recorder is gone for good (it stopped on a full disk); drop what
        is queued at once.
        """
        if not wait:
            self._socket.close(linger=0)
            return
        deadline = time.monotonic() + self._linger_s
        if self._coalescer is not None:
            for item in self._coalescer.take_all():
                self._queue_batch(item)
        pending = self._unsynced or bool(self._outbox) or self._window_used > 0
        delivered = not pending or self.sync(self._linger_s)
        if delivered and self._window_used:
            delivered = self.wait_durable(max(0.0, deadline - time.monotonic()))
        self._socket.close(linger=None if delivered else 0)


def _nbytes(frame: Any) -> int:
    if isinstance(frame, np.ndarray):
        return int(frame.nbytes)
    return len(frame)


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
