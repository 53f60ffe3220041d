"""The agent: a GPU node's sources published to a recorder on another host.

Every stream is renamed ``<agent name>.<stream>`` (the recorder only accepts those names
from that agent's key, so two nodes' ``gpu0`` never collide and no agent can write another's
streams), each source runs in the usual ``SourceRunner`` over CURVE, and a clock responder
answers the recorder's probes so its times can be put on the recorder's clock. The agent
stops when the recorder says the session is over, when told to, or when its sources die.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from wattlab.acquisition.acquirers import Acquirer, Chunk, Flushable, Reading
from wattlab.acquisition.session.source_runner import SourceRunner
from wattlab.errors import BusError, UsageError, WattlabError
from wattlab.samples import Gap, Marker, SourceDescriptor
from wattlab.sync.bus import ClientSecurity, explain, set_endpoint_security
from wattlab.sync.clock_service import ClockResponder
from wattlab.sync.recorder import StreamMetrics

SKEW_ENV = "WATTLAB_TEST_CLOCK_SKEW"  # "OFFSET_NS:DRIFT_PPM": simulate another host's clock
DEFAULT_CONNECT_TIMEOUT_S = 60.0  # as long as `record --agent` waits for its agents
WARN_AFTER_S = 3.0


@dataclass(frozen=True)
class ClockSkew:
    """A simulated host clock: ``t + offset_ns + t · drift_ppm / 1e6`` (tests and benches).

    Two processes on one machine share ``CLOCK_MONOTONIC``, so a skewed agent is how a test
    gets a second host whose clock truth is still known exactly.
    """

    offset_ns: int = 0
    drift_ppm: float = 0.0

    def __call__(self, t_ns: int) -> int:
        return t_ns + self.offset_ns + round(t_ns * self.drift_ppm * 1e-6)

    def array(self, t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        drift = np.round(t_ns.astype(np.float64) * (self.drift_ppm * 1e-6)).astype(np.int64)
        return t_ns + self.offset_ns + drift

    def now_ns(self) -> int:
        return self(time.monotonic_ns())

    @staticmethod
    def from_env() -> ClockSkew | None:
        text = os.environ.get(SKEW_ENV, "")
        if not text:
            return None
        try:
            offset, drift = text.split(":")
            return ClockSkew(int(offset), float(drift))
        except ValueError as e:
            raise UsageError(f"{SKEW_ENV}={text!r}: expected OFFSET_NS:DRIFT_PPM") from e


class HostAcquirer:
    """Wraps an acquirer: stream ids get the host prefix, times the host's (skewed) clock."""

    def __init__(self, inner: Acquirer, host: str, skew: ClockSkew | None = None,
                 metrics: StreamMetrics | None = None) -> None:
        self.inner = inner
        self.host = host
        self.skew = skew
        self.metrics = metrics  # --prometheus: this node's figures, fed as they are read

    def _id(self, source_id: str) -> str:
        return f"{self.host}.{source_id}"

    def _t(self, t_ns: int) -> int:
        return t_ns if self.skew is None or t_ns < 0 else self.skew(t_ns)

    def open(self) -> list[SourceDescriptor]:
        descs = self.inner.open()
        try:
            out = [replace(d, source_id=self._id(d.source_id),
                           config={**d.config, "agent": self.host}) for d in descs]
        except WattlabError:
            self.inner.close()
            raise
        if self.metrics is not None:
            for desc in out:
                self.metrics.describe(desc)
        return out

    def _map(self, readings: list[Reading]) -> list[Reading]:
        out: list[Reading] = []
        for item in readings:
            if isinstance(item, Chunk):
                t = item.t_host_ns if self.skew is None else self.skew.array(item.t_host_ns)
                out.append(Chunk(self._id(item.source_id), t, item.values, item.t_raw,
                                 item.flags))
                if self.metrics is not None:
                    self.metrics.add_rows(self._id(item.source_id), t, item.values)
            elif isinstance(item, Marker):
                out.append(Marker(self._t(item.t_host_ns), item.name, item.kind,
                                  self._id(item.source), item.payload))
            else:
                out.append(Gap(self._id(item.source), item.reason, item.seq_first,
                               item.seq_last, self._t(item.t_first_ns),
                               self._t(item.t_last_ns), item.samples_lost))
                if self.metrics is not None:
                    self.metrics.add_gap(self._id(item.source))
        return out

    def poll(self) -> list[Reading]:
        return self._map(self.inner.poll())

    def flush(self) -> list[Reading]:
        return self._map(self.inner.flush()) if isinstance(self.inner, Flushable) else []

    def close(self) -> None:
        self.inner.close()


def _to_stderr(line: str) -> None:
    print(f"wattlab agent: {line}", file=sys.stderr, flush=True)


@dataclass
class AgentResult:
    """What an agent did: its streams, why it stopped, which sources failed."""

    name: str
    sources: list[str]
    finished_by_recorder: bool
    probes_answered: int
    source_errors: dict[str, str] = field(default_factory=dict)


def await_recorder(responder: ClockResponder, name: str, timeout_s: float,
                   stop: threading.Event, say: Callable[[str], None]) -> bool:
    """Wait for the recorder's handshake (its first probe); False if stopped first.

    Why bounded and outspoken: ZeroMQ retries a refused or unanswered connection forever
    in silence, so after ``WARN_AFTER_S`` the agent says what the socket has seen (key
    refused, wrong server key, nothing listening), again when that changes, and gives up
    with a ``BusError`` after ``timeout_s``.
    """
    started = time.monotonic()
    said = ""
    while not responder.contacted.wait(0.05):
        if stop.is_set():
            return False
        waited_s = time.monotonic() - started
        why = explain(responder.link_state, responder.endpoint, name, responder.auth_status)
        if waited_s >= timeout_s:
            raise BusError(f"agent {name}: no handshake from a recorder in {timeout_s:g} s: "
                           f"{why}")
        if waited_s >= WARN_AFTER_S and why != said:
            say(f"no handshake from the recorder after {waited_s:.0f} s: {why}; waiting up "
                f"to {timeout_s:g} s (--connect-timeout)")
            said = why
    return True


def run_agent(
    endpoint: str,
    name: str,
    acquirers: list[tuple[str, Acquirer]],
    security: ClientSecurity,
    *,
    stop: threading.Event | None = None,
    skew: ClockSkew | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    say: Callable[[str], None] | None = None,
    metrics: StreamMetrics | None = None,
) -> AgentResult:
    """Publish ``acquirers`` to the recorder at ``endpoint`` until the session ends.

    The sources open once the recorder has answered (:func:`await_recorder`); ``say``
    gets the lines that tell why it has not yet (default: standard error).
    """
    if not endpoint.startswith("tcp://"):
        raise UsageError(f"agent endpoint {endpoint!r} must be tcp://HOST:PORT")
    if not acquirers:
        raise UsageError(f"agent {name}: nothing to publish (no GPU and no meter)")
    if not connect_timeout_s > 0:
        raise UsageError(f"--connect-timeout must be > 0 s, got {connect_timeout_s:g}")
    stop = stop or threading.Event()
    clock = skew.now_ns if skew is not None else time.monotonic_ns
    set_endpoint_security(endpoint, security)
    responder = ClockResponder(endpoint, name, clock_ns=clock, configure=security.apply)
    runners = [SourceRunner(f"{name}.{n}", HostAcquirer(a, name, skew, metrics), endpoint)
               for n, a in acquirers]
    sources: list[str] = []
    started: list[SourceRunner] = []
    try:
        responder.start()
        if await_recorder(responder, name, connect_timeout_s, stop, say or _to_stderr):
            for runner in runners:
                started.append(runner)
                sources += [d.source_id for d in runner.start()]
            responder.announce_sources(sources)
        while not stop.is_set() and not responder.finish_requested.is_set():
            if not any(r.alive for r in started):
                break
            stop.wait(0.05)
    finally:
        for runner in started:
            runner.stop()
        responder.stop()
        set_endpoint_security(endpoint, None)
    errors = {r.name: r.error for r in runners if r.error}
    return AgentResult(name, sources, responder.finish_requested.is_set(), responder.answered,
                       errors)

