"""Messages the recorder refuses, and the rows they carried as gap rows.

Why one place: a refused message is counted by kind, logged at most once a second per kind
(``RefusalLog``), and a refused batch is data someone sent and nobody will see, so it is a
gap row. A flood of refusals must cost a counter, not a line or a row each: dropped rows
are summed per stream and reason and written as one gap row per flush.
"""

from __future__ import annotations

import sys

from wattlab.errors import MalformedMessageError
from wattlab.samples import Gap
from wattlab.sync.bus import RefusalLog

MAX_DROP_KEYS = 32  # (stream, reason) pairs summed apart per flush; the rest go together
OTHER_STREAMS = "recorder"  # the gap rows' source for drops past MAX_DROP_KEYS


class Refused(MalformedMessageError):
    """A well-formed message the recorder will not take (wrong sender, over a limit)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


def _stderr_line(line: str) -> None:
    print(f"wattlab recorder: {line}", file=sys.stderr, flush=True)


class Refusals:
    """Counts per kind, the rate-limited log, and the rows refused since the last flush."""

    def __init__(self) -> None:
        self.log = RefusalLog(_stderr_line)
        self._dropped: dict[tuple[str, str], list[int]] = {}  # -> [messages, rows]

    def note(self, kind: str, peer: bytes, reason: str) -> None:
        self.log.note(kind, f"the last from peer {peer.hex()[:12]}: {reason}")

    def drop_rows(self, source_id: str, reason: str, rows: int) -> None:
        """One message (a batch of ``rows`` rows, a marker: 0) that will not be written.

        It becomes part of one gap row per stream and reason at the next flush.
        """
        key = (source_id, reason)
        if key not in self._dropped and len(self._dropped) >= MAX_DROP_KEYS:
            key = (OTHER_STREAMS, f"{reason} (streams past the first {MAX_DROP_KEYS})")
        counts = self._dropped.setdefault(key, [0, 0])
        counts[0] += 1
        counts[1] += rows

    def take_gaps(self) -> list[Gap]:
        """The gap rows for what was dropped since the last call (one per stream and reason)."""
        gaps = [Gap(source, f"{reason}: {messages} dropped"[:128], samples_lost=rows)
                for (source, reason), (messages, rows) in self._dropped.items()]
        self._dropped = {}
        return gaps

    def status(self) -> dict[str, int]:
        return dict(self.log.counts)
