"""The bus: message format, the sources' publisher (DEALER), coalescing, CurveZMQ, link health."""

from wattlab.sync.bus.link_monitor import CONNECTING, LinkMonitor, explain
from wattlab.sync.bus.publisher import (
    BusPublisher,
    ControlClient,
    private_endpoint,
    set_endpoint_security,
)
from wattlab.sync.bus.refusal_log import RefusalLog
from wattlab.sync.bus.security import (
    ClientSecurity,
    CurveServer,
    create_keypair,
    load_allowed_keys,
    load_keypair,
    load_public_key,
)

__all__ = [
    "CONNECTING",
    "BusPublisher",
    "ClientSecurity",
    "ControlClient",
    "CurveServer",
    "LinkMonitor",
    "RefusalLog",
    "create_keypair",
    "explain",
    "load_allowed_keys",
    "load_keypair",
    "load_public_key",
    "private_endpoint",
    "set_endpoint_security",
]
