"""Agents' clocks: probes, messages held until a clock is known, times mapped to this host.

Each agent host is probed by the clock service; what it sends before its clock is known
waits, in order; its times are mapped onto this host's monotonic clock.

Why apart from the router: a remote message may only be acted on once its host's clock is
known; keeping the held messages, the clock service and the mappings together leaves the
router one call (``when_clock``) to put a message in line, and the close one call for the
final models.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.errors import MalformedMessageError
from wattlab.samples import Gap, Marker
from wattlab.sync.clock_service import ClockPinger
from wattlab.sync.recorder.source_state import MAX_ANNOUNCED_SOURCES, SourceState

MAX_HELD_PER_HOST = 10_000
# per host: the clock service's probe table and its summary (``/sync/<host>``)
SyncTables = dict[str, tuple[npt.NDArray[Any], dict[str, Any]]]
# per remote stream: its host's final clock model, sender ns -> this host's ns
Remaps = dict[str, Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]]]


class RemoteClocks:
    """The clock service's pinger, and each host's messages waiting for its clock."""

    def __init__(self, interval_s: float, window_s: float,
                 send_remote: Callable[[bytes, list[Any]], None],
                 reject: Callable[[bytes, str], None]) -> None:
        """``send_remote`` sends frames to an agent; ``reject`` counts a bad held message."""
        self.pinger = ClockPinger(interval_s, window_s)
        self._send_remote = send_remote
        self._reject = reject
        self._held: dict[str, list[Callable[[], None]]] = {}
        self._held_lost: dict[str, int] = {}
        self.finish_sent = False

    # ---- messages that wait for a clock ---------------------------------------------------
    def when_clock(self, host: str, action: Callable[[], None]) -> None:
        """Run now if the host's clock is known, else keep it (in order) until it is."""
        tracker = self.pinger.trackers.get(host)
        held = self._held.get(host)
        if tracker is not None and tracker.ready and not held:
            action()
            return
        held = self._held.setdefault(host, [])
        if len(held) >= MAX_HELD_PER_HOST:
            self._held_lost[host] = self._held_lost.get(host, 0) + 1
            raise MalformedMessageError(f"host {host!r} sends but answers no clock probe; dropped")
        held.append(action)

    def _release_held(self, host: str) -> None:
        for action in self._held.pop(host, []):
            try:
                action()
            except MalformedMessageError as e:
                self._reject(b"", f"(held from {host}) {e}")

    def drop_held(self) -> list[Gap]:
        """At close: one gap per host that never answered, counting what it sent meanwhile."""
        gaps = []
        for host, held in self._held.items():
            lost = len(held) + self._held_lost.get(host, 0)
            gaps.append(Gap(f"{host}.clock", f"host {host} never answered a clock probe; "
                            f"{lost} message(s) dropped"[:128]))
        self._held.clear()
        return gaps

    # ---- the clock service ----------------------------------------------------------------
    def on_clock(self, identity: bytes, host: str, head: dict[str, Any], t4_ns: int) -> None:
        """A host's hello (its streams) or its reply to a probe."""
        if head["source"] != host:
            raise MalformedMessageError(f"host {host!r} sent clock traffic as {head['source']!r}")
        if head.get("hello") is True:
            sources = head.get("sources")
            if sources is not None and (
                not isinstance(sources, list) or len(sources) > MAX_ANNOUNCED_SOURCES
                or not all(isinstance(x, str) and x.startswith(f"{host}.") for x in sources)
            ):
                raise MalformedMessageError(f"host {host!r} announced a bad source list")
            self.pinger.hello(identity, host, sources)
            if self.finish_sent:
                self.pinger.finish_all(self._send_remote)
        elif "probe" in head:
            self.pinger.on_reply(identity, host, head, t4_ns)
            if self.pinger.trackers[host].ready and self._held.get(host):
                self._release_held(host)
        else:
            raise MalformedMessageError(f"clock message from {host!r} is neither hello nor reply")

    def send_due(self) -> None:
        """Probe the hosts whose next probe is due (until the finish was sent)."""
        if not self.finish_sent:
            self.pinger.send_due(self._send_remote)

    def send_finish(self) -> None:
        """Tell every host the session is stopping (once)."""
        if not self.finish_sent:
            self.finish_sent = True
            self.pinger.finish_all(self._send_remote)

    def next_due_ns(self) -> int | None:
        return self.pinger.next_due_ns()

    # ---- times onto this host's clock -----------------------------------------------------
    def local_times_ns(self, host: str | None,
                       t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Times stamped on ``host`` on this host's clock (``host`` None: already are)."""
        return t_ns if host is None else self.pinger.trackers[host].to_local_ns(t_ns)

    def _to_local(self, host: str, t_ns: int) -> int:
        if t_ns < 0:
            return t_ns
        return int(self.pinger.trackers[host].to_local_ns(np.array([t_ns]))[0])

    def marker_to_local(self, host: str, marker: Marker) -> Marker:
        gpu = None if marker.t_gpu_ns is None else self._to_local(host, marker.t_gpu_ns)
        return Marker(self._to_local(host, marker.t_host_ns), marker.name, marker.kind,
                      marker.source, {**marker.payload, "t_sender_ns": marker.t_host_ns},
                      gpu, marker.gpu_uncertainty_ns)

    def gap_to_local(self, host: str, gap: Gap) -> Gap:
        return Gap(gap.source, gap.reason, gap.seq_first, gap.seq_last,
                   self._to_local(host, gap.t_first_ns), self._to_local(host, gap.t_last_ns),
                   gap.samples_lost)

    # ---- reports and the final models ------------------------------------------------------
    def hosts_status(self, sources: dict[str, SourceState]) -> dict[str, Any]:
        hosts: dict[str, Any] = {}
        for host, tracker in self.pinger.trackers.items():
            hosts[host] = {
                "sources": sorted(s for s, st in sources.items() if st.host == host),
                "announced": self.pinger.announced.get(host),
                "clock": tracker.summary(),
                "held": len(self._held.get(host, [])),
            }
        return hosts

    def final_models(self, sources: dict[str, SourceState]) -> tuple[SyncTables, Remaps]:
        """For the close: each ready host's ``/sync`` table and each remote stream's mapping."""
        trackers = {h: t for h, t in self.pinger.trackers.items() if t.ready}
        remaps: Remaps = {
            sid: trackers[s.host].to_local_ns for sid, s in sources.items()
            if s.host is not None and s.host in trackers}
        sync = {h: (t.rows(), _plain(t.summary())) for h, t in trackers.items()}
        return sync, remaps


def _plain(summary: dict[str, Any]) -> dict[str, Any]:
    """HDF5 attributes: numbers and strings only."""
    return {k: v for k, v in summary.items() if isinstance(v, int | float | str)}
