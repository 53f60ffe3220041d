"""Clock service between hosts: NTP-style probes over ZeroMQ, min-RTT filtering, drift.

The recorder owns the estimate: it probes every agent host (``t1`` on its clock), the
agent's responder thread stamps receipt and reply on *its* clock (``t2``, ``t3``) and the
recorder stamps the reply's arrival (``t4``). Each probe bounds the remote clock within
±RTT/2; queueing anywhere (GIL, HDF5 flush, network) only ever lengthens the RTT, so the
probe with the smallest RTT in each window is the trustworthy one. A line (offset + drift)
through those window-best points maps remote monotonic ns onto the recorder's monotonic ns;
each point counts less the more its round trip exceeds the shortest (``probe_weights``),
since that excess is queueing that may have fallen on one leg only;
runs longer than ``fit_span_s`` get a local line per point, joined piecewise, so slow
drift changes (temperature) are followed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import zmq

from wattlab.errors import BusError, MalformedMessageError
from wattlab.runfile import (
    DRIFT_PPM,
    FIT_OFFSET_NS,
    FIT_SPAN_S,
    HOST,
    OFFSET_NS,
    PROBES,
    PROBES_REJECTED,
    RESIDUAL_RMS_NS,
    RTT_MEDIAN_NS,
    RTT_MIN_NS,
    RTT_NS,
    SYNC_PROBES_DTYPE,
    WINDOW_S,
    WINDOWS,
)
from wattlab.sync.bus import CONNECTING, LinkMonitor, message


@dataclass(frozen=True)
class ClockProbe:
    """One request/reply: t1, t4 on the local clock; t2, t3 on the remote clock (ns)."""

    t1_ns: int
    t2_ns: int
    t3_ns: int
    t4_ns: int

    @property
    def rtt_ns(self) -> int:
        return (self.t4_ns - self.t1_ns) - (self.t3_ns - self.t2_ns)

    @property
    def offset_ns(self) -> float:
        """Remote minus local, exact if both legs took equally long."""
        return ((self.t2_ns - self.t1_ns) + (self.t3_ns - self.t4_ns)) / 2

    @property
    def local_mid_ns(self) -> int:
        return (self.t1_ns + self.t4_ns) // 2

    @property
    def remote_mid_ns(self) -> int:
        return (self.t2_ns + self.t3_ns) // 2


@dataclass
class _Window:
    best: ClockProbe
    count: int = 1


def probe_weights(rtt_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Least-squares weights (1/σ) of window-best probes from their round trips.

    A probe's offset can be wrong by up to half its RTT's excess over the shortest one
    seen (queueing on one leg only). σ is that half-excess plus its median, so a typical
    probe is not trusted as if it were exact while a late, queued one (seen at 2× the
    usual RTT when a run stops on a busy machine) counts a few percent as much.
    """
    half_excess = (rtt_ns - rtt_ns.min()).astype(np.float64) / 2
    floor_ns = max(float(np.median(half_excess)), 1_000.0)
    return 1.0 / (floor_ns + half_excess)


class ClockTracker:
    """Offset and drift of one remote host's monotonic clock against the local one."""

    def __init__(self, host: str, window_s: float = 1.0, fit_span_s: float = 120.0) -> None:
        self.host = host
        self.window_ns = int(window_s * 1e9)
        self.fit_span_ns = int(fit_span_s * 1e9)
        self.probes = 0
        self.rejected = 0
        self._windows: list[_Window] = []
        self._first_local_ns: int | None = None
        self._model: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None
        self._remote_ref = 0

    @property
    def ready(self) -> bool:
        return bool(self._windows)

    def add(self, probe: ClockProbe) -> None:
        """Keep the probe if it is the best (smallest RTT) of its window so far."""
        if probe.rtt_ns < 0 or probe.t3_ns < probe.t2_ns or probe.t4_ns < probe.t1_ns:
            self.rejected += 1
            return
        self.probes += 1
        if self._first_local_ns is None:
            self._first_local_ns = probe.local_mid_ns
        index = (probe.local_mid_ns - self._first_local_ns) // self.window_ns
        last = self._windows[-1] if self._windows else None
        last_index = (
            (last.best.local_mid_ns - self._first_local_ns) // self.window_ns if last else -1
        )
        if last is not None and index == last_index:
            last.count += 1
            if probe.rtt_ns < last.best.rtt_ns:
                last.best = probe
                self._model = None
        else:
            self._windows.append(_Window(probe))
            self._model = None

    def _points(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[Any]]:
        best = [w.best for w in self._windows]
        remote = np.array([p.remote_mid_ns for p in best], dtype=np.int64)
        local = remote - np.round([p.offset_ns for p in best]).astype(np.int64)
        rtt = np.array([p.rtt_ns for p in best], dtype=np.int64)
        return remote, local, rtt

    def _knots(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Knots (remote, local − remote) of the piecewise-linear model, relative to ref."""
        if self._model is not None:
            return self._model
        remote, local, rtt = self._points()
        # windows whose best probe still queued somewhere are less trustworthy: drop the
        # ones with an RTT over three times the typical best
        good = rtt <= max(3 * float(np.median(rtt)), float(np.min(rtt)) + 20_000)
        x = (remote[good] - remote[0]).astype(np.float64)
        y = (local[good] - remote[good]).astype(np.float64)
        w = probe_weights(rtt[good])
        if x.shape[0] == 1:
            knots = (x, y)
        elif x[-1] - x[0] <= self.fit_span_ns:
            slope, intercept = np.polyfit(x, y, 1, w=w)
            ends = np.array([x[0], x[-1]])
            knots = (ends, intercept + slope * ends)
        else:
            half = self.fit_span_ns / 2
            fitted = np.empty_like(y)
            for i, xi in enumerate(x):
                near = np.abs(x - xi) <= half
                slope, intercept = np.polyfit(x[near], y[near], 1, w=w[near])
                fitted[i] = intercept + slope * xi
            knots = (x, fitted)
        self._model = knots
        self._remote_ref = int(remote[0])
        return knots

    def to_local_ns(self, remote_ns: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Remote monotonic ns → local monotonic ns (linear extrapolation past the ends)."""
        if not self.ready:
            raise BusError(f"no clock estimate for host {self.host!r} yet")
        kx, ky = self._knots()
        r = np.asarray(remote_ns, dtype=np.int64)
        x = (r - self._remote_ref).astype(np.float64)
        if kx.shape[0] == 1:
            corr = np.full(x.shape, ky[0])
        else:
            corr = np.interp(x, kx, ky)
            lo_slope = (ky[1] - ky[0]) / (kx[1] - kx[0])
            hi_slope = (ky[-1] - ky[-2]) / (kx[-1] - kx[-2])
            corr = np.where(x < kx[0], ky[0] + lo_slope * (x - kx[0]), corr)
            corr = np.where(x > kx[-1], ky[-1] + hi_slope * (x - kx[-1]), corr)
        return r + np.round(corr).astype(np.int64)

    @property
    def drift_ppm(self) -> float:
        """How much faster the remote clock runs than the local one (overall)."""
        if not self.ready:
            return 0.0
        kx, ky = self._knots()
        if kx.shape[0] < 2 or kx[-1] == kx[0]:
            return 0.0
        local_per_remote = 1.0 + (ky[-1] - ky[0]) / (kx[-1] - kx[0])
        return (1.0 / local_per_remote - 1.0) * 1e6

    def rows(self) -> npt.NDArray[Any]:
        """The window-best probes with the final model, for ``/sync/<host>``."""
        out = np.zeros(len(self._windows), dtype=SYNC_PROBES_DTYPE)
        if not self._windows:
            return out
        remote, _, _ = self._points()
        fitted = remote - self.to_local_ns(remote)
        for i, w in enumerate(self._windows):
            p = w.best
            out[i] = (p.local_mid_ns, p.remote_mid_ns, p.offset_ns, p.rtt_ns, fitted[i], w.count)
        return out

    def summary(self) -> dict[str, Any]:
        """Plain numbers for status replies and ``/sync/<host>`` attributes."""
        if not self.ready:
            return {HOST: self.host, PROBES: self.probes, WINDOWS: 0}
        rows = self.rows()
        resid = rows[OFFSET_NS] - rows[FIT_OFFSET_NS]
        return {
            HOST: self.host,
            PROBES: self.probes,
            PROBES_REJECTED: self.rejected,
            WINDOWS: len(self._windows),
            OFFSET_NS: float(rows[FIT_OFFSET_NS][-1]),
            DRIFT_PPM: self.drift_ppm,
            RTT_MIN_NS: int(rows[RTT_NS].min()),
            RTT_MEDIAN_NS: float(np.median(rows[RTT_NS])),
            RESIDUAL_RMS_NS: float(np.sqrt(np.mean(resid**2))),
            WINDOW_S: self.window_ns / 1e9,
            FIT_SPAN_S: self.fit_span_ns / 1e9,
        }


class ClockPinger:
    """Recorder side: which peers answer probes, when to probe them, what came back."""

    def __init__(self, interval_s: float = 0.1, window_s: float = 1.0,
                 clock_ns: Callable[[], int] = time.monotonic_ns, burst: int = 3) -> None:
        self.interval_ns = int(interval_s * 1e9)
        self.burst = max(1, burst)
        self.window_s = window_s
        self.clock_ns = clock_ns
        self.trackers: dict[str, ClockTracker] = {}
        self.responders: dict[bytes, str] = {}
        self.announced: dict[str, list[str]] = {}
        self._outstanding: dict[bytes, tuple[int, int]] = {}
        self._next_ns: dict[bytes, int] = {}
        self._round: dict[bytes, tuple[int, int]] = {}  # identity → (round start, probes left)
        self._rid = 0

    def hello(self, identity: bytes, host: str, sources: list[str] | None) -> None:
        """A responder introduced itself (and maybe listed the sources its host sends)."""
        self.responders[identity] = host
        self.trackers.setdefault(host, ClockTracker(host, self.window_s))
        self._next_ns.setdefault(identity, 0)
        if sources is not None:
            self.announced[host] = sources

    def next_due_ns(self) -> int | None:
        return min(self._next_ns.values()) if self._next_ns else None

    def send_due(self, send: Callable[[bytes, list[Any]], None]) -> None:
        """Probe every responder that is due; t1 is stamped just before the send.

        Probes go in rounds of ``burst``, each sent as soon as the previous one came back:
        a responder idle since the last round wakes slowly (CPU sleep states), which delays
        only the first leg and biases that probe; the later ones find it awake.
        """
        now = self.clock_ns()
        for identity, due in list(self._next_ns.items()):
            if due > now:
                continue
            start, left = self._round.get(identity, (now, 0))
            if left <= 0:
                start, left = now, self.burst
            self._round[identity] = (start, left - 1)
            self._rid += 1
            frames = message.encode_clock("recorder", probe=self._rid)
            t1 = self.clock_ns()
            send(identity, frames)
            self._outstanding[identity] = (self._rid, t1)
            # if the reply never comes, the next round starts on schedule
            self._next_ns[identity] = start + self.interval_ns

    def on_reply(self, identity: bytes, host: str, head: dict[str, Any], t4_ns: int) -> None:
        """A probe came back; validate it against what was sent to that very peer."""
        if self.responders.get(identity) != host:
            raise MalformedMessageError(f"clock reply from a peer that is not {host!r}'s responder")
        sent = self._outstanding.get(identity)
        t2, t3 = head.get("t2"), head.get("t3")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**62
                   for t in (t2, t3)):
            raise MalformedMessageError("clock reply needs integer t2 and t3 in [0, 2**62)")
        if sent is None or head.get("probe") != sent[0]:
            return  # a late reply to an older probe: harmless, ignored
        del self._outstanding[identity]
        self.trackers[host].add(ClockProbe(sent[1], int(t2), int(t3), t4_ns))  # type: ignore[arg-type]
        _, left = self._round.get(identity, (0, 0))
        if left > 0 and identity in self._next_ns:
            self._next_ns[identity] = 0  # the rest of the round: at once

    def finish_all(self, send: Callable[[bytes, list[Any]], None]) -> None:
        """Tell every responder the session is over (its agent then ends its sources)."""
        for identity in self.responders:
            send(identity, message.encode_clock("recorder", finish=True))
        self._next_ns.clear()


class ClockResponder:
    """Agent side: a thread with its own socket that answers probes at once.

    A dedicated thread keeps the turnaround short and independent of the sources' polling.
    The recorder's ``finish`` is exposed as ``finish_requested``; its first message (the
    handshake: it knows us) as ``contacted``; until then ``link_state`` says, from the
    socket's monitor, why it has not come (``sync/bus/link_monitor.py``).
    """

    def __init__(self, endpoint: str, host: str, clock_ns: Callable[[], int] = time.monotonic_ns,
                 configure: Callable[[zmq.Socket[Any]], None] | None = None,
                 hello_interval_s: float = 1.0) -> None:
        self.endpoint = endpoint
        self.host = host
        self.clock_ns = clock_ns
        self.finish_requested = threading.Event()
        self.contacted = threading.Event()
        self.link_state = CONNECTING
        self.auth_status = 0
        self.answered = 0
        self._configure = configure
        self._hello_interval_s = hello_interval_s
        self._sources: list[str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"clock-{host}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def announce_sources(self, source_ids: list[str]) -> None:
        """Tell the recorder which sources this host sends (sent with the next hello)."""
        with self._lock:
            self._sources = list(source_ids)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _hello(self, sock: zmq.Socket[Any]) -> None:
        with self._lock:
            fields: dict[str, Any] = {"hello": True}
            if self._sources is not None:
                fields["sources"] = self._sources
        frames = message.encode_clock(self.host, **fields)
        with contextlib.suppress(zmq.Again):  # never block: a refused hello is just not sent
            sock.send_multipart(frames, zmq.NOBLOCK)  # type: ignore[arg-type]

    def _watch(self, link: LinkMonitor | None) -> LinkMonitor | None:
        """Follow the link until the recorder has spoken; then stop watching."""
        if link is None:
            return None
        if self.contacted.is_set():
            link.close()
            return None
        self.link_state = link.poll()
        self.auth_status = link.auth_status
        return link

    def _run(self) -> None:
        context: zmq.Context[Any] = zmq.Context.instance()
        sock: zmq.Socket[Any] = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        link: LinkMonitor | None = LinkMonitor(sock)
        try:
            if self._configure is not None:
                self._configure(sock)
            sock.connect(self.endpoint)
            next_hello = 0.0
            while not self._stop.is_set():
                link = self._watch(link)
                if time.monotonic() >= next_hello:
                    self._hello(sock)
                    next_hello = time.monotonic() + self._hello_interval_s
                if not sock.poll(50, zmq.POLLIN):
                    continue
                frames = sock.recv_multipart()
                t2 = self.clock_ns()
                try:
                    head = message.decode_header(frames)
                except MalformedMessageError:
                    continue
                if head.get("type") != "clock":
                    continue
                self.contacted.set()
                if head.get("finish") is True:
                    self.finish_requested.set()
                elif isinstance(head.get("probe"), int):
                    reply = message.encode_clock(self.host, probe=head["probe"], t2=t2,
                                                 t3=self.clock_ns())
                    try:
                        sock.send_multipart(reply, zmq.NOBLOCK)  # type: ignore[arg-type]
                    except zmq.Again:
                        continue
                    self.answered += 1
        finally:
            if link is not None:
                link.close()
            sock.close(0)
