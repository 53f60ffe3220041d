"""The recorder's two ROUTER sockets: where messages come in and where answers go out.

Why apart from the routing: binding (and, for agents, CURVE and the ZAP authenticator),
receiving in bursts, naming a remote peer by its key and answering on the socket a message
came in on are the same whatever the message says; the router only decides what it means.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import zmq

from wattlab.errors import UsageError
from wattlab.sync.bus import message
from wattlab.sync.recorder.admission.limits import MAX_FRAME_BYTES
from wattlab.sync.recorder.config import RecorderConfig
from wattlab.sync.recorder.source_state import SourceState

if TYPE_CHECKING:
    from wattlab.sync.bus import CurveServer

RECV_BURST = 256
# messages queued per local client: a flooding client holds at most this many frames of
# the recorder's memory (10,000 small batches of a flood were 160 MB; issue 36)
RECV_HWM = 1000
REMOTE_RECV_HWM = 100_000
# kernel socket buffer: large messages cross in fewer system calls and wake-ups
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
LINGER_MS = 1000
# frames, the peer's authenticated name (None: it has none), arrival time
RemoteMessage = tuple[list[Any], str | None, int]


class RecorderSockets:
    """The local ROUTER and, with ``listen``, the CURVE-only one for remote agents."""

    def __init__(self, context: zmq.Context[Any]) -> None:
        self.local = context.socket(zmq.ROUTER)
        self.local.setsockopt(zmq.RCVHWM, RECV_HWM)
        self.local.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
        self.local.setsockopt(zmq.LINGER, LINGER_MS)
        # a larger frame drops its connection before it is received whole (issue 36)
        self.local.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.remote: zmq.Socket[Any] | None = None
        self._remote_context: zmq.Context[Any] | None = None
        self.curve: CurveServer | None = None
        self.peer = self.local  # the socket the message being handled came in on

    def bind(self, config: RecorderConfig) -> None:
        self.local.bind(config.endpoint)
        if config.listen:
            self._bind_remote(config)

    def _bind_remote(self, config: RecorderConfig) -> None:
        """The CURVE-only socket for agents on other hosts."""
        if not config.listen.startswith("tcp://"):
            raise UsageError(f"listen endpoint {config.listen!r} must be tcp://ADDRESS:PORT")
        if not config.server_key or not config.allowed_keys:
            raise UsageError("listening for agents needs the recorder's secret key and a folder "
                             "of allowed agent keys; the remote bus is never open")
        # imported here: CURVE's authenticator pulls in asyncio, start-up a local run skips
        from wattlab.sync.bus import CurveServer, load_allowed_keys, load_keypair

        keys = load_keypair(config.server_key)
        allowed = load_allowed_keys(config.allowed_keys)
        self._remote_context = zmq.Context()
        self.curve = CurveServer(self._remote_context, keys, allowed)
        self.remote = self._remote_context.socket(zmq.ROUTER)
        self.remote.setsockopt(zmq.RCVHWM, REMOTE_RECV_HWM)
        self.remote.setsockopt(zmq.LINGER, LINGER_MS)
        self.remote.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.curve.apply(self.remote)
        try:
            self.remote.bind(config.listen)
        except zmq.ZMQError as e:
            raise UsageError(f"cannot listen on {config.listen}: {e}") from e

    @property
    def listen_endpoint(self) -> str:
        """Where agents connect (with the port the OS chose for ``:0``)."""
        if self.remote is None:
            return ""
        endpoint = self.remote.getsockopt(zmq.LAST_ENDPOINT)
        return endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)

    @property
    def refused_peers(self) -> int:
        """Agents the authenticator turned away (0 without a remote socket)."""
        return self.curve.refused if self.curve is not None else 0

    def register(self, poller: zmq.Poller) -> None:
        poller.register(self.local, zmq.POLLIN)
        if self.remote is not None:
            poller.register(self.remote, zmq.POLLIN)

    def local_messages(self) -> Iterator[list[Any]]:
        """Up to ``RECV_BURST`` messages waiting on the local socket, one at a time."""
        for _ in range(RECV_BURST):
            try:
                frames = self.local.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            yield frames

    def remote_messages(self) -> Iterator[RemoteMessage]:
        """Up to ``RECV_BURST`` messages from agents, stamped on arrival and named by key.

        The stamp is a clock reply's t4; the name is None for a peer without one.
        """
        if self.remote is None:
            return
        for _ in range(RECV_BURST):
            try:
                frames = self.remote.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            t_recv_ns = time.monotonic_ns()
            try:
                host = frames[-1].get("User-Id")
            except (zmq.ZMQError, AttributeError):
                host = None
            yield frames, (None if not host or host == "unknown" else str(host)), t_recv_ns

    def answer_on(self, remote: bool) -> None:
        """Replies go back on the remote socket (a remote message) or the local one."""
        self.peer = (self.remote or self.local) if remote else self.local

    def reply(self, identity: bytes, **fields: Any) -> None:
        """Answer the peer of the message being handled, on the socket it came in on."""
        self.peer.send_multipart([identity, *message.encode_reply(**fields)])

    def reply_local(self, identity: bytes, **fields: Any) -> None:
        """Answer a local control client (the session) whatever was handled last."""
        self.peer = self.local
        self.reply(identity, **fields)

    def send_remote(self, identity: bytes, frames: list[Any]) -> None:
        if self.remote is not None:
            self.remote.send_multipart([identity, *frames])

    def send_to(self, state: SourceState, frames: list[Any]) -> None:
        """A message to the publisher of a stream, on the socket it came in on."""
        if state.identity is None:
            return
        sock = self.local if state.host is None else self.remote
        if sock is not None:
            sock.send_multipart([state.identity, *frames])

    def close(self, *, at_once: bool = False) -> None:
        """Close both sockets; ``at_once`` (start-up failed) drops what is still queued.

        Otherwise the file is closed and the last answers leave first (the socket's linger).
        """
        self.local.close(0 if at_once else None)
        if self.remote is not None:
            self.remote.close(0)
        if self.curve is not None:
            self.curve.stop()
        if self._remote_context is not None:
            self._remote_context.term()
