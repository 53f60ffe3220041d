"""A live terminal panel of a run being recorded, fed by following the run file (SWMR).

Reading the file instead of the bus means the panel shows exactly what is being kept, and
works the same from another terminal (`wattlab live RUN`) as inside `wattlab record`.
The reader never holds an HDF5 file lock (the recorder must be able to reopen the file to
add a source or write its final attributes) and reopens the file about once a second to
see new sources and the ``session_end_monotonic_ns`` attribute written at close.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wattlab.acquisition.meters import duration_text, rate_text
from wattlab.analysis.energy import GAP_FACTOR, energy_channel, power_channel
from wattlab.errors import RunFileError
from wattlab.runfile import SESSION_END_MONOTONIC_NS, Run, SourceView, recorded_writer, writer_alive
from wattlab.sync.recorder import room_bytes

SPARK_CHARS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 24
SPARK_WINDOW_S = 12.0
RATE_WINDOW_S = 2.0
LOW_SPACE_BYTES = 512 * 1024 * 1024  # show the free space below this
LOW_SPACE_S = 600.0  # ... or when it lasts less than this at the file's growth rate
GROWTH_WINDOW_S = 10.0


def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """The last values as block characters, scaled to their own min..max."""
    if not values:
        return ""
    data = np.asarray(values[-width:], dtype=float)
    finite = data[np.isfinite(data)]
    if finite.size == 0:
        return " " * data.size
    lo, hi = float(finite.min()), float(finite.max())
    span = hi - lo if hi > lo else 1.0
    levels = np.clip(((data - lo) / span * (len(SPARK_CHARS) - 1)).round(), 0,
                     len(SPARK_CHARS) - 1)
    return "".join(" " if not np.isfinite(v) else SPARK_CHARS[int(lv)]
                   for v, lv in zip(data, np.nan_to_num(levels), strict=True))


@dataclass
class SourceStatus:
    """What the panel shows for one source."""

    source_id: str
    channel: str | None
    unit: str
    samples: int = 0
    power_w: float | None = None
    rate_hz: float = 0.0
    energy_j: float | None = None
    gaps: int = 0
    samples_lost: int = 0
    spark: str = ""


@dataclass
class _Tracker:
    """Per-source running state kept across polls and reopens."""

    channel: str | None
    counter: bool
    unit: str
    rows: int = 0
    energy_j: float = 0.0
    limit_ns: float = 0.0
    last: tuple[int, float] | None = None
    first_counter: float | None = None
    recent: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=200_000))
    bins: dict[int, list[float]] = field(default_factory=dict)

    def feed(self, t_ns: np.ndarray[Any, Any], v: np.ndarray[Any, Any]) -> None:
        if t_ns.size == 0:
            return
        v = v.astype(np.float64)
        if self.limit_ns == 0.0 and t_ns.size > 1:
            self.limit_ns = GAP_FACTOR * float(np.median(np.diff(t_ns)))
        if self.counter:
            if self.first_counter is None:
                self.first_counter = float(v[0])
            self.energy_j = float(v[-1]) - self.first_counter
        else:
            t = t_ns if self.last is None else np.r_[self.last[0], t_ns]
            p = v if self.last is None else np.r_[self.last[1], v]
            dt = np.diff(t).astype(np.float64)
            ok = (dt <= self.limit_ns) if self.limit_ns > 0 else np.ones(dt.shape, bool)
            self.energy_j += float(np.sum((0.5 * (p[1:] + p[:-1]) * dt / 1e9)[ok]))
        self.last = (int(t_ns[-1]), float(v[-1]))
        bin_ns = SPARK_WINDOW_S / SPARK_WIDTH * 1e9
        for b, value in zip((t_ns // bin_ns).astype(np.int64), v, strict=True):
            self.bins.setdefault(int(b), []).append(float(value))
        newest = int(t_ns[-1] // bin_ns)
        for b in [b for b in self.bins if b <= newest - SPARK_WIDTH]:
            del self.bins[b]
        step = max(1, t_ns.size // 2000)
        self.recent.extend(zip(t_ns[::step].tolist(), [step] * len(t_ns[::step]), strict=True))
        while self.recent and self.recent[0][0] < t_ns[-1] - RATE_WINDOW_S * 1e9:
            self.recent.popleft()

    def rate_hz(self) -> float:
        if len(self.recent) < 2:
            return 0.0
        span_s = (self.recent[-1][0] - self.recent[0][0]) / 1e9
        count = sum(int(c) for _, c in self.recent) - int(self.recent[-1][1])
        return count / span_s if span_s > 0 else 0.0

    def spark(self) -> str:
        if not self.bins:
            return ""
        newest = max(self.bins)
        means = [float(np.mean(self.bins[b])) if b in self.bins else float("nan")
                 for b in range(newest - SPARK_WIDTH + 1, newest + 1)]
        while means and not np.isfinite(means[0]):
            means.pop(0)
        return sparkline(means)


def space_note(free_bytes: int, growth_bytes_s: float) -> str:
    """The panel's free-space note: empty while there is plenty."""
    left_s = free_bytes / growth_bytes_s if growth_bytes_s > 0 else float("inf")
    if free_bytes >= LOW_SPACE_BYTES and left_s >= LOW_SPACE_S:
        return ""
    note = f"disk: {free_bytes / 2**20:.1f} MB free"
    if left_s < float("inf"):
        note += f", full in ~{duration_text(left_s)} at {rate_text(growth_bytes_s)}"
    return note


class SpaceWatch:
    """Free space beside a run file and how fast the file grows (for the live panel)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sizes: deque[tuple[float, int]] = deque()

    def poll(self) -> str:
        try:
            size = os.path.getsize(self.path)
            free = room_bytes(self.path, size)
        except OSError:
            return ""
        now = time.monotonic()
        self._sizes.append((now, size))
        while self._sizes and self._sizes[0][0] < now - GROWTH_WINDOW_S:
            self._sizes.popleft()
        (t0, s0), (t1, s1) = self._sizes[0], self._sizes[-1]
        return space_note(free, (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0)


class RunFollower:
    """Follows a run file while it is written; ``poll()`` returns the current status."""

    def __init__(self, path: str, reopen_interval_s: float = 1.0) -> None:
        self.path = path
        self.reopen_interval_s = reopen_interval_s
        self._run: Run | None = None
        self._opened_at = 0.0
        self._trackers: dict[str, _Tracker] = {}
        self.finished = False
        self.started = False
        self.abandoned = False  # its recorder is gone and never closed it (a crash-left file)

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None

    def __enter__(self) -> RunFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_open(self) -> Run | None:
        due = time.monotonic() - self._opened_at >= self.reopen_interval_s
        if self._run is not None and not due:
            self._run.refresh()
            return self._run
        self.close()  # every handle must go for a fresh open to see the final attributes
        try:
            self._run = Run(self.path)
        except (RunFileError, OSError):
            return None  # not created yet, or the recorder is between SWMR phases
        self._opened_at = time.monotonic()
        self.started = True
        self.finished = SESSION_END_MONOTONIC_NS in self._run.attrs
        if not self.finished:
            writer = recorded_writer(self._run.attrs)
            self.abandoned = bool(writer) and writer_alive(writer) is False
        return self._run

    def _tracker(self, view: SourceView) -> _Tracker:
        tracker = self._trackers.get(view.source_id)
        if tracker is None:
            channel = power_channel(view)
            counter = False
            if channel is None and (energy := energy_channel(view)) is not None:
                channel, counter = energy, True
            unit = view.unit(channel) if channel else ""
            tracker = _Tracker(channel, counter, unit)
            self._trackers[view.source_id] = tracker
        return tracker

    def poll(self) -> list[SourceStatus]:
        """Read what was appended since the last poll."""
        run = self._ensure_open()
        if run is None:
            return self.statuses({})
        for view in run.sources.values():
            tracker = self._tracker(view)
            n = len(view)
            if tracker.channel is not None and n > tracker.rows:
                try:
                    t_ns = view.time_slice(tracker.rows, n)
                    values = view.column_slice(tracker.channel, tracker.rows, n)
                except OSError:
                    # The writer closed and reopened the file (a stream added after SWMR
                    # began): this handle's end of file is stale. Reopen on the next poll
                    # and read these rows then; nothing is skipped.
                    self._opened_at = -math.inf
                    return self.statuses({})
                tracker.feed(t_ns, values)
            tracker.rows = n
        lost: dict[str, tuple[int, int]] = {}
        for gap in run.gaps:
            count, samples = lost.get(gap.source, (0, 0))
            lost[gap.source] = (count + 1, samples + max(gap.samples_lost, 0))
        return self.statuses(lost)

    def statuses(self, lost: dict[str, tuple[int, int]]) -> list[SourceStatus]:
        out = []
        for sid, tr in sorted(self._trackers.items()):
            gaps, samples_lost = lost.get(sid, (0, 0))
            power = None if tr.counter or tr.last is None else tr.last[1]
            energy = tr.energy_j if tr.channel is not None and tr.last is not None else None
            out.append(SourceStatus(sid, tr.channel, tr.unit, tr.rows, power, tr.rate_hz(),
                                    energy, gaps, samples_lost, "" if tr.counter else tr.spark()))
        return out


def render(statuses: list[SourceStatus], path: str, elapsed_s: float, finished: bool,
           space: str = "") -> Any:
    """A rich Table of the current status (one row per source); ``space``: a low-disk note."""
    from rich.table import Table

    state = "finished" if finished else ("waiting for the file" if not statuses else "recording")
    title = f"wattlab live: {os.path.basename(path)} - {state} - {elapsed_s:.0f} s"
    if space:
        title += f" - [bold red]{space}[/bold red]"
    table = Table(title=title, title_justify="left", expand=False)
    for name, justify in (("source", "left"), ("power (W)", "right"), ("rate (Hz)", "right"),
                          ("samples", "right"), ("drops", "right"), ("energy (J)", "right"),
                          ("last 12 s", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for s in statuses:
        if s.channel is None:
            continue
        drops = f"{s.gaps} gaps, {s.samples_lost} lost" if s.gaps else "0"
        table.add_row(
            s.source_id,
            "-" if s.power_w is None else f"{s.power_w:.1f}",
            f"{s.rate_hz:.1f}", str(s.samples),
            f"[red]{drops}[/red]" if s.gaps else drops,
            "-" if s.energy_j is None else f"{s.energy_j:.1f}",
            s.spark)
    return table


def plain_table(statuses: list[SourceStatus]) -> str:
    """The final status as plain text (for logs, where no live panel is drawn)."""
    lines = [f"{'source':<18} {'samples':>9} {'rate Hz':>9} {'power W':>9} {'energy J':>11} "
             f"{'gaps':>5}"]
    for s in statuses:
        if s.channel is None:
            continue
        power = "-" if s.power_w is None else f"{s.power_w:.1f}"
        energy = "-" if s.energy_j is None else f"{s.energy_j:.1f}"
        lines.append(f"{s.source_id:<18} {s.samples:>9} {s.rate_hz:>9.1f} {power:>9} "
                     f"{energy:>11} {s.gaps:>5}")
    return "\n".join(lines)


def follow(path: str, *, console: Any = None, interval_s: float = 0.5,
           stop: threading.Event | None = None, wait_s: float = 30.0) -> list[SourceStatus]:
    """Show the panel until the recorder closes the file, ``stop`` is set, or Ctrl-C.

    Draws only when the console is a terminal; otherwise it follows quietly. Returns the
    last status. Raises RunFileError if the file does not appear within ``wait_s``, or if
    its recorder (on this host) is gone without closing it.
    """
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    stop = stop or threading.Event()
    started = time.monotonic()
    statuses: list[SourceStatus] = []
    live_cm: Any = (Live(console=console, refresh_per_second=4, transient=False)
                    if console.is_terminal else contextlib.nullcontext())
    space = SpaceWatch(path)
    with RunFollower(path) as follower, live_cm as live:
        while True:
            statuses = follower.poll()
            elapsed = time.monotonic() - started
            if live is not None:
                live.update(render(statuses, path, elapsed, follower.finished, space.poll()))
            if follower.finished or stop.is_set():
                break
            if follower.abandoned:
                raise RunFileError(f"{path}: its recorder is gone and never closed the file "
                                   f"(killed or crashed); nothing more will come: run "
                                   f"`wattlab repair {path}`, then `wattlab info` or `report`")
            if not follower.started and elapsed > wait_s:
                raise RunFileError(f"{path}: no run file appeared within {wait_s:g} s")
            stop.wait(interval_s)
    return statuses


@contextlib.contextmanager
def live_panel(path: str, enabled: bool | None = None, interval_s: float = 0.5,
               console: Any = None) -> Iterator[list[BaseException]]:
    """Draw the panel in a thread while the body records into ``path`` (for `record`).

    ``enabled=None`` means: only when stdout is a terminal. Yields the list of errors the
    panel met (it never raises into the recording).
    """
    from rich.console import Console

    console = console or Console()
    errors: list[BaseException] = []
    if enabled is False or (enabled is None and not console.is_terminal):
        yield errors
        return
    stop = threading.Event()

    def worker() -> None:
        try:
            follow(path, console=console, interval_s=interval_s, stop=stop, wait_s=3600.0)
        except Exception as e:  # the panel must never break a recording
            errors.append(e)

    thread = threading.Thread(target=worker, name="wattlab-live", daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join(5.0)
