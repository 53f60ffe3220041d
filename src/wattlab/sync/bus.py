"""The bus: sources (DEALER) connect to the recorder (ROUTER).

Why DEALER/ROUTER and not PUB/SUB: PUB drops everything sent before a subscriber joins
(the slow-joiner problem) and whenever it falls behind; a DEALER queues messages until the
recorder is there, and the ROUTER can talk back (acks, "describe yourself again" after a
recorder restart), which is the start handshake. Arrays are sent without copies.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from typing import Any

import zmq

from wattlab.errors import BusError
from wattlab.samples import Gap, Marker, SampleBatch, SourceDescriptor
from wattlab.sync import message
from wattlab.sync.coalesce import Coalescer
from wattlab.sync.security import ClientSecurity

DEFAULT_SEND_HWM = 100_000
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


class BusPublisher:
    """Sends one or more sources' messages to a recorder; one per thread (zmq rule)."""

    def __init__(
        self, endpoint: str, context: zmq.Context[Any] | None = None, linger_ms: int = 10_000,
        security: ClientSecurity | None = None, coalesce_rows: int = 0,
    ) -> None:
        """Connect a DEALER to ``endpoint`` (with CurveZMQ keys where given).

        ``coalesce_rows`` > 0 joins a source's consecutive batches up to that many rows;
        they leave on ``flush()`` (call it after each read), on any other message, or when
        full.
        """
        self.endpoint = endpoint
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.SNDHWM, DEFAULT_SEND_HWM)
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
        self._unsynced = False
        self._linger_s = linger_ms / 1000 if linger_ms >= 0 else 3600.0
        self._replies: dict[str, dict[str, Any]] = {}
        self._coalescer = Coalescer(coalesce_rows) if coalesce_rows > 0 else None

    def _send(self, frames: list[Any]) -> None:
        self._unsynced = True
        try:
            self._socket.send_multipart(frames, copy=False)
        except zmq.Again as e:
            raise BusError(f"bus send to {self.endpoint} timed out: is the recorder there and "
                           "does it accept this agent's key?") from e
        except zmq.ZMQError as e:
            raise BusError(f"bus send to {self.endpoint} failed: {e}") from e

    def announce(self, desc: SourceDescriptor) -> None:
        """Tell the recorder what a source is; resent whenever the recorder asks."""
        self.flush()
        self._descriptors[desc.source_id] = desc
        self._send(message.encode_descriptor(desc))

    def send_batch(self, batch: SampleBatch) -> None:
        if batch.source_id not in self._descriptors:
            raise BusError(f"source {batch.source_id!r} sends data before announcing itself")
        self.serve_requests()
        ready = [batch] if self._coalescer is None else self._coalescer.add(batch)
        for item in ready:
            self._send(message.encode_batch(item))

    def flush(self) -> None:
        """Send the batches held back for coalescing (order with other messages is kept)."""
        if self._coalescer is not None:
            for item in self._coalescer.take_all():
                self._send(message.encode_batch(item))

    def send_marker(self, marker: Marker) -> None:
        self.flush()
        self._send(message.encode_marker(marker))

    def send_gap(self, gap: Gap) -> None:
        self.flush()
        self._send(message.encode_gap(gap))

    def end(self, source_id: str, last_seq: int) -> None:
        """Say a source has finished, so the recorder knows nothing more is coming."""
        self.flush()
        self._send(message.encode_end(source_id, last_seq))

    def serve_requests(self) -> None:
        """Answer the recorder's requests (descriptor acks, re-describe) without blocking."""
        while self._socket.poll(0, zmq.POLLIN):
            frames = self._socket.recv_multipart()
            try:
                head = message.decode_header(frames)
            except BusError:
                continue
            if head.get("ack") in self._descriptors:
                self._acked.add(head["ack"])
            if isinstance(head.get("rid"), str):
                self._replies[head["rid"]] = head
            wanted = head.get("describe")
            if isinstance(wanted, str) and wanted in self._descriptors:
                self._send(message.encode_descriptor(self._descriptors[wanted]))

    def wait_ready(self, timeout_s: float) -> None:
        """The start handshake: block until the recorder acknowledged every descriptor."""
        deadline = time.monotonic() + timeout_s
        while not set(self._descriptors) <= self._acked:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                missing = sorted(set(self._descriptors) - self._acked)
                raise BusError(f"no recorder acknowledged {missing} at {self.endpoint}")
            if self._socket.poll(min(left_ms, 50), zmq.POLLIN):
                self.serve_requests()

    def sync(self, timeout_s: float) -> bool:
        """Block until the recorder has received everything sent so far (FIFO per pipe).

        A closed socket alone does not guarantee delivery: a process that exits without
        terminating its ZeroMQ context (os._exit, a forked child) drops queued messages.
        """
        self.flush()
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
        deadline = time.monotonic() + timeout_s
        while rid not in self._replies:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return False
            if self._socket.poll(min(left_ms, 100), zmq.POLLIN):
                self.serve_requests()
        del self._replies[rid]
        self._unsynced = False
        return True

    def close(self) -> None:
        """Close after the recorder confirmed it has everything (bounded by the linger time)."""
        self.flush()
        delivered = not self._unsynced or self.sync(self._linger_s)
        self._socket.close(linger=None if delivered else 0)


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
