"""Whether a peer may send a message: stream ownership, new-stream and marker limits.

Why apart from the recorder's dispatch: each rule here is a refusal with its count, its
log line and (where rows were lost) its gap row; the recorder only asks, then hands the
message on.
"""

from __future__ import annotations

from typing import Any

from wattlab.errors import MalformedMessageError
from wattlab.runfile import RunFileWriter
from wattlab.samples import Marker
from wattlab.sync.recorder.admission.limits import (
    MARKERS_BURST,
    MARKERS_PER_S,
    MAX_STREAMS,
    NEW_STREAMS_BURST,
    NEW_STREAMS_PER_S,
    PeerBuckets,
)
from wattlab.sync.recorder.admission.refusals import Refusals, Refused
from wattlab.sync.recorder.source_state import SourceState


class Gate:
    """The recorder's admission rules over its streams (``sources``, shared, live)."""

    def __init__(self, sources: dict[str, SourceState], refusals: Refusals,
                 writer: RunFileWriter) -> None:
        self._sources = sources
        self._refusals = refusals
        self._writer = writer
        self._new_streams = PeerBuckets(NEW_STREAMS_BURST, NEW_STREAMS_PER_S)
        self._markers = PeerBuckets(MARKERS_BURST, MARKERS_PER_S)

    def local_source(self, identity: bytes, head: dict[str, Any]) -> None:
        """A stream's messages are taken only from the client that described it.

        A new descriptor for a stream that ended is a restarted source carrying on; a
        stream resumed from a crashed recorder's file belongs to the first client that
        speaks for it. A refused batch is a gap row (its rows are lost to whoever sent it).
        """
        source_id, kind = head["source"], head["type"]
        state = self._sources.get(source_id)
        if state is None:
            return
        if state.host is not None:
            why = f"stream {source_id!r} belongs to host {state.host!r}"
        elif state.owner is None or state.owner == identity:
            state.owner = identity
            return
        elif kind == "descriptor" and state.ended:
            return
        else:
            why = f"{kind} for stream {source_id!r} from a client that did not describe it"
        if kind == "batch":
            rows = head.get("n")
            self._refusals.drop_rows(source_id, "batch from a client that does not own the "
                                     "stream", rows if isinstance(rows, int) else 0)
        raise Refused("message(s) for streams other clients described", why)

    def remote_source(self, host: str, source_id: str) -> None:
        """An agent may only speak for streams named after it (and already its own)."""
        state = self._sources.get(source_id)
        if state is not None and state.host != host:
            owner = "this host" if state.host is None else f"host {state.host!r}"
            raise MalformedMessageError(f"host {host!r} sent for stream {source_id!r} of {owner}")
        if not source_id.startswith(f"{host}."):
            raise MalformedMessageError(
                f"host {host!r} may only send streams named '{host}.*', not {source_id!r}")

    def marker_rate(self, peer: bytes | str, marker: Marker) -> None:
        """A client or agent over its marker rate: refused, and a gap row counts them."""
        if not self._markers.allow(peer):
            self._refusals.drop_rows(marker.source, "marker over its sender's rate limit "
                                     f"({MARKERS_PER_S:g}/s)", 0)
            raise Refused("marker(s) over the rate limit",
                          f"marker {marker.name!r} from {marker.source!r} over "
                          f"{MARKERS_PER_S:g}/s")

    def new_stream(self, peer: bytes | str, source_id: str) -> None:
        """At most ``MAX_STREAMS``; in SWMR mode (a new stream reopens the file) a rate each."""
        if len(self._sources) >= MAX_STREAMS:
            raise Refused("new stream(s) over the limit",
                          f"stream {source_id!r}: a recording takes at most {MAX_STREAMS}")
        if self._writer.swmr and not self._new_streams.allow(peer):
            raise Refused("new stream(s) over the limit",
                          f"stream {source_id!r}: over {NEW_STREAMS_BURST} new streams at "
                          f"once, then {NEW_STREAMS_PER_S:g}/s, from one client")
