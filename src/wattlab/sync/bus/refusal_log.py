"""Refusals counted per kind and logged at most once a second per kind, with the count.

Why: a flood of rejected messages (garbage on the local bus, a client with fresh CURVE keys
retrying its handshake) wrote one stderr line each, up to 2.3 M lines in 10 s. An operator
needs to know that refusals happen, how many and what the last one was; one line a second
per kind says that, and the exact totals stay in the recorder's status.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

LOG_EVERY_S = 1.0


class RefusalLog:
    """Counts refusals by kind; ``note`` writes a line per kind at most every ``every_s``.

    The first refusal of a kind is logged at once; the ones after it within the interval are
    counted and summed into the next line of that kind (or ``flush_lines`` at the end).
    Thread-safe: the ZAP authenticator calls it from its own thread.
    """

    def __init__(self, write: Callable[[str], None], every_s: float = LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self._unlogged: dict[str, int] = {}
        self._last_detail: dict[str, str] = {}
        self._next_line_s: dict[str, float] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def last(self, kind: str) -> str:
        return self._last_detail.get(kind, "")

    def note(self, kind: str, detail: str) -> None:
        """One refusal of ``kind``; ``detail`` says what and from whom (the last one is shown)."""
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
            self._last_detail[kind] = detail
            now_s = self._clock()
            if now_s < self._next_line_s.get(kind, 0.0):
                return
            self._next_line_s[kind] = now_s + self._every_s
            line = self._line(kind)
        self._write(line)

    def flush_lines(self) -> None:
        """Log what was counted but not logged yet (at close: no refusal goes unsaid)."""
        with self._lock:
            lines = [self._line(kind) for kind, n in list(self._unlogged.items()) if n]
        for line in lines:
            self._write(line)

    def _line(self, kind: str) -> str:
        n = self._unlogged.pop(kind, 0)
        total = self.counts[kind]
        head = f"refused {n} {kind}" if n != 1 else f"refused 1 {kind}"
        return f"{head} ({total} in all; at most one line a second): {self._last_detail[kind]}"
