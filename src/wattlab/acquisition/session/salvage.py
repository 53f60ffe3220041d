"""A run file whose recorder did not close it: repaired by the session, the loss said.

Why the session does it: a recorder that died, or that stalled and had to be killed,
leaves its file open for writing and without gap rows for what it never wrote. The
session still knows what each source sent (rows per stream, counted by the runners), so
it repairs the file at once (the same repair as `wattlab repair`), with a cut-off gap row
per stream that had not ended carrying the rows lost, and prints one line: per stream the
rows kept against the rows sent. Where the repair cannot run, that line names the
`wattlab repair` command instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from wattlab.errors import WattlabError
from wattlab.runfile import CutOff, Run, repair_run


@dataclass(frozen=True)
class Salvage:
    """What became of the file of a recorder that did not close it."""

    output: str
    why: str  # what happened to the recorder, in words
    rows_sent: dict[str, int]
    rows_kept: dict[str, int] = field(default_factory=dict)  # {}: the repair failed
    gap_rows: int = 0  # cut-off gap rows the repair added
    error: str | None = None  # why the repair failed

    @property
    def rows_lost(self) -> int:
        return sum(max(sent - self.rows_kept.get(sid, 0), 0)
                   for sid, sent in self.rows_sent.items())

    def line(self) -> str:
        """The one line that says what was lost (or how to finish the file)."""
        if self.error is not None:
            sent = ", ".join(f"{sid} {n}" for sid, n in sorted(self.rows_sent.items()))
            return (f"wattlab: {self.why}; rows sent: {sent or 'none'}; the file could not "
                    f"be repaired here ({self.error}): run `wattlab repair {self.output}`")
        streams = sorted(set(self.rows_sent) | set(self.rows_kept))
        counts = ", ".join(f"{sid} {self.rows_kept.get(sid, 0)}/"
                           f"{self.rows_sent.get(sid, '?')}"
                           for sid in streams)
        return (f"wattlab: {self.why}; {self.output} repaired, {self.rows_lost} row(s) lost, "
                f"rows kept/sent: {counts}; {self.gap_rows} cut-off gap row(s) in /gaps")


def salvage(output: str, why: str, rows_sent: Mapping[str, int], until_ns: int) -> Salvage:
    """Repair ``output`` after its recorder was lost (``why``) and count what it kept.

    ``until_ns``: when the sources were told to stop (monotonic), the end of what was lost.
    """
    sent = dict(rows_sent)
    reason = f"recording cut off: {why} (file repaired by the session)"[:128]
    try:
        in_gaps = _rows_in_gaps(output)
        uncounted = {sid: n - in_gaps.get(sid, 0) for sid, n in sent.items()}
        report = repair_run(output, cut_off=CutOff(reason, uncounted, until_ns))
        with Run(output) as run:
            kept = {sid: len(run.source(sid)) for sid in run.sources}
    except (WattlabError, OSError) as e:
        return Salvage(output, why, sent, error=str(e))
    return Salvage(output, why, sent, kept, len(report.gaps_added))


def _rows_in_gaps(output: str) -> dict[str, int]:
    """Rows of the sources' own batches the file's gap rows already count, per stream.

    Why: the cut-off gap row carries the rows sent but neither kept nor in another gap
    row; sent - kept alone counted the batches a source dropped (its backlog full) twice.
    Those gap rows name the sequence numbers; refused batches of other clients (rows our
    sources never sent) name none and are left out.
    """
    counted: dict[str, int] = {}
    try:
        with Run(output) as run:
            for gap in run.gaps:
                if gap.samples_lost > 0 and gap.seq_first >= 0:
                    counted[gap.source] = counted.get(gap.source, 0) + gap.samples_lost
    except (WattlabError, OSError):  # unreadable before its repair: no gap rows to count
        return {}
    return counted
