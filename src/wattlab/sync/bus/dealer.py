"""A publisher's DEALER socket and the ways it sends.

Why apart from the publisher: how a message leaves (blocking, bounded by a timeout over the
remote bus; without blocking in backlog mode; once or never for a hello; with a timeout of
its own for a sync) and whether anything left since the last sync are the same whatever is
sent; the publisher only decides what to send and when.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import zmq

from wattlab.errors import BusError
from wattlab.sync.bus.security import ClientSecurity

DEFAULT_SEND_HWM = 100_000
BACKLOG_SEND_HWM = 1000  # backlog mode: a full pipe is the publisher's cue to keep or drop


class DealerSocket:
    """A DEALER connected to a recorder, with CurveZMQ keys where given."""

    def __init__(self, endpoint: str, context: zmq.Context[Any], linger_ms: int,
                 security: ClientSecurity | None, *, blocking: bool) -> None:
        """``blocking``: sends wait for the pipe (else a full pipe is reported, not waited)."""
        self.endpoint = endpoint
        self.blocking = blocking
        self._socket = context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.SNDHWM, DEFAULT_SEND_HWM if blocking else BACKLOG_SEND_HWM)
        self._socket.setsockopt(zmq.LINGER, linger_ms)
        self._socket.setsockopt(zmq.IDENTITY, uuid.uuid4().hex.encode())
        # over the remote bus a refused or vanished recorder must not hang a source forever
        self.send_timeout_ms = -1 if security is None else max(1000, linger_ms)
        self._socket.setsockopt(zmq.SNDTIMEO, self.send_timeout_ms)
        try:
            if security is not None:
                security.apply(self._socket)
            self._socket.connect(endpoint)
        except zmq.ZMQError as e:
            self._socket.close(0)
            raise BusError(f"cannot connect to bus endpoint {endpoint!r}: {e}") from e
        self.unsynced = False  # something was sent since the last confirmed sync

    def send(self, frames: list[Any]) -> None:
        """Send now, blocking (bounded by the send timeout over the remote bus)."""
        self.unsynced = True
        try:
            self._socket.send_multipart(frames, copy=False)
        except zmq.Again as e:
            raise BusError(f"bus send to {self.endpoint} timed out: is the recorder there and "
                           "does it accept this agent's key?") from e
        except zmq.ZMQError as e:
            raise BusError(f"bus send to {self.endpoint} failed: {e}") from e

    def try_send(self, frames: list[Any]) -> bool:
        """Send without blocking (backlog mode) or blocking; False: the pipe is full."""
        if self.blocking:
            self.send(frames)
            return True
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            raise BusError(f"bus send to {self.endpoint} failed: {e}") from e
        self.unsynced = True
        return True

    def send_if_room(self, frames: list[Any]) -> None:
        """Send if the pipe takes it now, else not at all (the caller tries again later)."""
        with contextlib.suppress(zmq.ZMQError):
            self._socket.send_multipart(frames, zmq.NOBLOCK)

    def send_within(self, frames: list[Any], timeout_s: float) -> bool:
        """Send, waiting at most ``timeout_s``; False: it could not leave in time.

        A peer that refused us (CURVE) leaves no pipe and a plain send would block forever.
        """
        self._socket.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_s * 1000)))
        try:
            self._socket.send_multipart(frames)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            raise BusError(f"bus send to {self.endpoint} failed: {e}") from e
        finally:
            self._socket.setsockopt(zmq.SNDTIMEO, self.send_timeout_ms)
        return True

    def poll(self, timeout_ms: int, events: int = zmq.POLLIN) -> bool:
        """Whether ``events`` are possible within ``timeout_ms``."""
        return bool(self._socket.poll(timeout_ms, events))

    def receive(self) -> list[bytes]:
        return self._socket.recv_multipart()

    def close(self, linger_ms: int | None) -> None:
        """Close; ``linger_ms`` None: the socket's own linger time."""
        self._socket.close(linger=linger_ms)
