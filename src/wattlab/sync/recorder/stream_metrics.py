"""Running figures per stream for a metrics exporter: last power, energy, counts.

Why here and not from the run file: the recorder (and an agent) already holds every row
once, as it writes (or sends) it; integrating those rows costs a few array operations per
stream per flush, while following the file would read everything a second time. Energy
follows ``wattlab energy``'s convention (trapezoids between consecutive samples, a hole
bridged by a line between its edge samples), so the counter and the offline figure agree.
Updates come from the recording thread(s), reads from the exporter's thread: one lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.samples import Marker, SourceDescriptor
from wattlab.sync.recorder.live_energy import LiveProcessEnergy, ProcessFigures


def watt_channels(desc: SourceDescriptor) -> list[str]:
    """The W channels whose energy ``wattlab energy`` reports (none if the source says so)."""
    if "power_channel" in desc.config and desc.config["power_channel"] is None:
        return []  # its watts are a setting (a power limit), not a draw
    return [c.name for c in desc.channels if c.unit == "W"]


@dataclass
class StreamFigures:
    """One stream's figures so far (a copy is handed to readers)."""

    source: str
    channels: list[str]  # the W channels, in the order of ``power_w`` and ``energy_j``
    power_w: list[float] = field(default_factory=list)  # last finite value of each
    energy_j: list[float] = field(default_factory=list)
    samples: int = 0
    gaps: int = 0
    last_unix_s: float | None = None  # wall time of the newest sample
    # what of docs/validity.md can be judged live: time never went back, every value finite
    ordered_and_finite: bool = True

    @property
    def valid(self) -> bool:
        """The energy so far passes the live checks: those above, and no gap recorded."""
        return self.ordered_and_finite and self.gaps == 0


@dataclass
class _Stream:
    figures: StreamFigures
    columns: npt.NDArray[np.intp]
    last_t_ns: int | None = None
    last_w: npt.NDArray[np.float64] | None = None


@dataclass
class MetricsSnapshot:
    """What an exporter shows at one instant."""

    streams: list[StreamFigures]
    info: list[dict[str, str]]  # one label set per stream: instrument, model, driver
    clock_offsets_s: dict[str, float]  # remote host -> its clock minus this host's
    processes: ProcessFigures | None = None  # per-pod and per-job energy (recorder only)


class StreamMetrics:
    """Per-stream last power, integrated energy, sample and gap counts; thread-safe.

    ``unix_minus_monotonic_ns`` turns the monotonic sample times fed in into wall time
    (Prometheus speaks unix seconds). ``processes``: split each GPU's energy among its pods
    and jobs too (the recorder: it alone receives the processes' markers).
    """

    def __init__(self, unix_minus_monotonic_ns: int | None = None,
                 processes: bool = False) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._info: dict[str, dict[str, str]] = {}
        self._offsets_s: dict[str, float] = {}
        self._processes = LiveProcessEnergy() if processes else None
        self.unix_minus_monotonic_ns = (time.time_ns() - time.monotonic_ns()
                                        if unix_minus_monotonic_ns is None
                                        else unix_minus_monotonic_ns)

    def describe(self, desc: SourceDescriptor) -> None:
        """A stream is announced (again, after a restart: its figures carry on)."""
        channels = watt_channels(desc)
        names = desc.channel_names
        with self._lock:
            self._info[desc.source_id] = info_labels(desc)
            if self._processes is not None:
                self._processes.describe(desc)
            if desc.source_id in self._streams:
                return
            figures = StreamFigures(desc.source_id, channels, [float("nan")] * len(channels),
                                    [0.0] * len(channels))
            self._streams[desc.source_id] = _Stream(
                figures, np.array([names.index(c) for c in channels], dtype=np.intp))

    def add_rows(self, source_id: str, t_ns: npt.NDArray[np.int64],
                 values: npt.NDArray[Any]) -> None:
        """Rows of a stream, in time order, continuing the last ones fed."""
        n = len(t_ns)
        with self._lock:
            stream = self._streams.get(source_id)
            if stream is None or n == 0:
                return
            if self._processes is not None:
                self._processes.add_rows(source_id, t_ns, values)
            fig = stream.figures
            fig.samples += n
            fig.last_unix_s = (int(t_ns[-1]) + self.unix_minus_monotonic_ns) / 1e9
            if not len(stream.columns):
                return
            w = values[:, stream.columns].astype(np.float64, copy=False)
            if stream.last_t_ns is not None and stream.last_w is not None:
                t = np.concatenate(([stream.last_t_ns], t_ns))
                w = np.concatenate((stream.last_w[None, :], w))
            else:
                t = t_ns
            fig.ordered_and_finite &= bool(np.all(np.diff(t) >= 0) and np.isfinite(w).all())
            if len(t) > 1:
                mid = 0.5 * (w[1:] + w[:-1]) * (np.diff(t) * 1e-9)[:, None]
                added = np.nansum(mid, axis=0)  # a non-finite reading adds nothing
                fig.energy_j = [e + float(a) for e, a in zip(fig.energy_j, added, strict=True)]
            stream.last_t_ns, stream.last_w = int(t[-1]), w[-1].copy()
            finite = np.isfinite(w[-1])
            fig.power_w = [float(v) if ok else p
                           for v, ok, p in zip(w[-1], finite, fig.power_w, strict=True)]

    def set_gaps(self, source_id: str, gaps: int) -> None:
        with self._lock:
            stream = self._streams.get(source_id)
            if stream is not None:
                stream.figures.gaps = gaps

    def add_gap(self, source_id: str) -> None:
        with self._lock:
            stream = self._streams.get(source_id)
            if stream is not None:
                stream.figures.gaps += 1

    def add_markers(self, markers: list[Marker]) -> None:
        """Markers as the recorder writes them: the processes' identities come and go."""
        with self._lock:
            if self._processes is not None:
                self._processes.add_markers(markers)

    def set_clock_offset(self, host: str, offset_ns: float) -> None:
        """A remote host's clock minus this host's, as its newest samples were mapped."""
        with self._lock:
            self._offsets_s[host] = offset_ns / 1e9

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            streams = [StreamFigures(f.source, list(f.channels), list(f.power_w),
                                     list(f.energy_j), f.samples, f.gaps, f.last_unix_s,
                                     f.ordered_and_finite)
                       for f in (s.figures for s in self._streams.values())]
            return MetricsSnapshot(streams, [dict(v) for v in self._info.values()],
                                   dict(self._offsets_s),
                                   None if self._processes is None
                                   else self._processes.figures(time.monotonic_ns()))


def info_labels(desc: SourceDescriptor) -> dict[str, str]:
    """What instrument a stream comes from: GPU name or meter model, driver, serial."""
    return {"source": desc.source_id, "kind": desc.kind, "model": desc.model,
            "driver": str(desc.config.get("driver_version", "")),
            "firmware": desc.firmware, "serial": desc.serial, "host": desc.host}
