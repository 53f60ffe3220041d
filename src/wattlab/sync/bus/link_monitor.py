"""Why a CurveZMQ client has not reached its server, from its socket's monitor events.

Why: ZeroMQ retries a connection in silence. A client whose key the server's allow-list
refuses, one holding the wrong server key, and one with nothing listening at the address
all just see no messages. libzmq's socket monitor tells them apart: the server's ZAP
handler refusing the key is ``HANDSHAKE_FAILED_AUTH``, a server that cannot decrypt our
CURVE hello (it is not the key we were given) shows as a failed handshake with no detail
or a protocol error, and nothing listening is only ever ``CONNECT_RETRIED`` (which also
follows every failed handshake, as ZeroMQ schedules the next try: so a handshake's outcome
is what the link is, once there was one).
"""

from __future__ import annotations

from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

CONNECTING = "connecting"
NOTHING_LISTENING = "nothing listening"
KEY_REFUSED = "key refused"
WRONG_SERVER_KEY = "wrong server key"
CONNECTED = "connected"

_STATES = {
    zmq.EVENT_CONNECT_RETRIED: NOTHING_LISTENING,
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: KEY_REFUSED,
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: WRONG_SERVER_KEY,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: WRONG_SERVER_KEY,
    zmq.EVENT_HANDSHAKE_SUCCEEDED: CONNECTED,
}


class LinkMonitor:
    """Follows one socket's connection events; only the socket's own thread may poll it."""

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self._sock = sock
        self._events = sock.get_monitor_socket(
            zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.state = CONNECTING
        self.auth_status = 0  # the ZAP status code of a refusal (400: key not allowed)

    def poll(self) -> str:
        """Take in the events so far (never blocks); the link's state after them."""
        while self._events.poll(0):
            event = recv_monitor_message(self._events)
            state = _STATES.get(zmq.Event(event["event"]))
            if state == NOTHING_LISTENING and self.state not in (CONNECTING, NOTHING_LISTENING):
                continue  # a retry after a handshake: that handshake says more
            if state is not None:
                self.state = state
                if state == KEY_REFUSED:
                    self.auth_status = int(event["value"])
        return self.state

    def close(self) -> None:
        self._sock.disable_monitor()
        self._events.close(0)


def explain(state: str, endpoint: str, key_name: str, auth_status: int = 400) -> str:
    """What a user should check, for each state of a link that got no answer."""
    if state == KEY_REFUSED:
        return (f"the recorder at {endpoint} refused this agent's key (ZAP status "
                f"{auth_status}): {key_name}.key is not in the folder given to its "
                "--allow-keys")
    if state == WRONG_SERVER_KEY:
        return (f"the CURVE handshake with {endpoint} failed: --server-key is not the "
                "public key of the recorder listening there")
    if state == NOTHING_LISTENING:
        return (f"nothing is listening at {endpoint} (is `wattlab record --listen` running "
                "there, on that port?)")
    if state == CONNECTED:
        return f"connected to {endpoint}, but no wattlab recorder has answered"
    return f"no connection to {endpoint} yet"
