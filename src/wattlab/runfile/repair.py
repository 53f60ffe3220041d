"""``wattlab repair``: turn a run file its recorder died with into a closed one.

What a crash leaves: the superblock still says "open for writing" (plain HDF5 readers
refuse the file), a dataset of a source may be longer than its siblings or end in rows
sized but never written, the run-wide tables may end in blank rows, and nothing that the
recorder does at a clean close happened. Repair checks every source's datasets against
``/progress`` (the recorder's record of what each flush left whole), keeps every row that
all of a source's datasets hold whole (also rows written after the last progress record:
nothing will resend them), trims the torn rest, adds the gap that says where the
recording was cut off, fits device clocks as a close does, and records all of it in the
``repair_json`` attribute. It reuses the recorder's own resume and close, so a repaired
file has exactly the layout of a cleanly closed one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from wattlab.errors import RunFileError, UsageError
from wattlab.runfile import schema
from wattlab.runfile.crash_flags import crash_flags
from wattlab.runfile.h5_read import open_read_only
from wattlab.runfile.layout_check import check_not_truncated
from wattlab.runfile.processes import recorded_writer, writer_alive
from wattlab.runfile.writer import ResumePoint, RunFileWriter, unreadable_gaps
from wattlab.samples import Gap

CUT_OFF_REASON = "recording cut off by a crash (file repaired)"


@dataclass(frozen=True)
class CutOff:
    """What the caller knows about the cut (a session repairing its own file).

    ``rows_sent``: rows each stream's source sent, so a cut-off gap row carries the rows
    lost (sent - kept) and a stream that ended but lacks rows gets one too; ``until_ns``:
    when the recording was cut (monotonic), the gap rows' end.
    """

    reason: str = CUT_OFF_REASON
    rows_sent: Mapping[str, int] = field(default_factory=dict)
    until_ns: int = -1


@dataclass(frozen=True)
class WriterStatus:
    """Whether a run file is still open for writing, and by a process that still runs."""

    flags: int  # the superblock's consistency flags; 0: closed (by HDF5, at least once)
    writer: dict[str, Any]  # host, pid, ... as the recorder stamped them ({}: older file)
    alive: bool | None  # None: cannot tell (another host, or no stamp)
    unfinished: bool = False  # the writer's clean close never ran (schema.UNFINISHED)

    @property
    def open(self) -> bool:
        """Still owned by a writer, or left so: flags set, or a close that never finished."""
        return self.flags != 0 or self.unfinished

    @property
    def needs_repair(self) -> bool:
        """Left open by a writer that is gone (or may be): `wattlab repair` makes it whole."""
        return self.open and self.alive is not True

    def describe(self, path: str) -> str:
        """One line for `wattlab info` and repair's refusals."""
        who = (f"pid {self.writer.get('pid')} on {self.writer.get('host')}" if self.writer
               else "a recorder that did not record its process")
        if not self.open:
            return f"{path}: closed cleanly"
        if self.alive:
            return f"{path}: being recorded now by {who}"
        if self.flags == 0:
            return (f"{path}: its writer ({who}) stopped between two closes of the file, "
                    f"before its clean close; `wattlab repair {path}` finishes it")
        if self.alive is False:
            return (f"{path}: left open by a recorder that is gone ({who}); HDF5 tools other "
                    f"than wattlab refuse it until `wattlab repair {path}`")
        return (f"{path}: open for writing by {who}, or left so by a crash; if no recording "
                f"is running, `wattlab repair --force {path}` makes it readable everywhere")


def writer_status(path: str) -> WriterStatus:
    """The superblock's flags and, if set, whether the process that set them still runs."""
    flags = crash_flags(path)
    with open_read_only(path) as f:
        unfinished = schema.UNFINISHED in f.attrs
        writer = recorded_writer(f.attrs) if flags or unfinished else {}
    if not (flags or unfinished):
        return WriterStatus(0, {}, None)
    return WriterStatus(flags, writer, writer_alive(writer) if writer else None, unfinished)


@dataclass
class RepairReport:
    """What repair found and did (also stored, as JSON, in the file's ``repair_json``)."""

    path: str
    repaired: bool  # False: the file was closed cleanly; nothing was changed
    crash_flags: int = 0
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    tables_trimmed: dict[str, int] = field(default_factory=dict)
    gaps_added: list[str] = field(default_factory=list)
    rows_sent: dict[str, int] = field(default_factory=dict)  # as the session counted them
    sources_unreadable: list[str] = field(default_factory=list)  # removed: never whole on disk

    @property
    def rows_trimmed(self) -> int:
        return sum(s["rows_trimmed"] for s in self.sources.values())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def repair_run(path: str, *, force: bool = False, cut_off: CutOff | None = None
               ) -> RepairReport:
    """Repair ``path`` in place; refuses while its recorder runs (``force``: when unknown)."""
    if os.path.isdir(path):
        raise RunFileError(f"{path}: is a folder, not a run file")
    if not os.path.isfile(path):
        raise RunFileError(f"{path}: no such file")
    check_not_truncated(path)
    session_start_ns = _session_start_ns(path)  # a foreign file is refused, never "clean"
    status = writer_status(path)
    if not status.open:
        return RepairReport(path, repaired=False)
    if status.alive:
        raise UsageError(f"{status.describe(path)}: repair it once the recording has ended")
    if status.alive is None and not force:
        raise UsageError(f"{status.describe(path)} (repair changes the file: it asks for "
                         "--force where it cannot check)")
    writer, points = RunFileWriter.resume(path, session_start_ns, keep_unconfirmed=True)
    cut_off = cut_off or CutOff()
    report = RepairReport(path, True, status.flags,
                          {sid: _source_record(p) for sid, p in points.items()},
                          dict(writer.tables_dropped), rows_sent=dict(cut_off.rows_sent),
                          sources_unreadable=list(writer.sources_unreadable))
    try:
        last_ns = writer.last_time_ns()
        cut = [Gap(sid, cut_off.reason, p.seq_next if not p.rows_unconfirmed else -1,
                   t_first_ns=-1 if (t := last_ns.get(sid)) is None else session_start_ns + t,
                   t_last_ns=cut_off.until_ns, samples_lost=_rows_lost(cut_off, sid, p))
               for sid, p in points.items() if not p.ended or _rows_lost(cut_off, sid, p) > 0]
        cut += [Gap(sid, cut_off.reason, t_last_ns=cut_off.until_ns, samples_lost=rows)
                for sid, rows in cut_off.rows_sent.items() if sid not in points and rows > 0
                and sid not in report.sources_unreadable]
        cut += unreadable_gaps(writer, cut_off.reason, cut_off.until_ns, cut_off.rows_sent)
        if cut:
            writer.add_gaps(cut)
        report.gaps_added = [g.source for g in cut]
        end_ns = max((t for t in last_ns.values() if t is not None), default=None)
        record = {**report.to_json(), "repaired_at": dt.datetime.now(dt.UTC).isoformat(),
                  "writer": status.writer,
                  "session_end": "the last row kept: when the crash came is unknown"}
        final: dict[str, Any] = {schema.REPAIR_JSON: json.dumps(record, sort_keys=True)}
        if end_ns is not None:
            final[schema.SESSION_END_MONOTONIC_NS] = session_start_ns + end_ns
    except BaseException:
        writer.close(finished=False)
        raise
    writer.close(final)
    return report


def _rows_lost(cut_off: CutOff, source_id: str, point: ResumePoint) -> int:
    """Rows sent but not kept; -1 where unknown (or where the count cannot be right)."""
    sent = cut_off.rows_sent.get(source_id)
    lost = -1 if sent is None else sent - point.rows - point.rows_unconfirmed
    return lost if lost >= 0 else -1


def _session_start_ns(path: str) -> int:
    """The run's session start, or a refusal naming the file: HDF5, but not a wattlab run."""
    with open_read_only(path) as f:
        if schema.SESSION_START_MONOTONIC_NS not in f.attrs or schema.PROGRESS not in f:
            raise RunFileError(f"{path}: not a wattlab run file (no /{schema.PROGRESS} or "
                               "session start); only run files written by `wattlab record` "
                               "can be repaired")
        return int(f.attrs[schema.SESSION_START_MONOTONIC_NS])


def _source_record(point: ResumePoint) -> dict[str, int]:
    return {"rows_kept": point.rows + point.rows_unconfirmed,
            "rows_confirmed": point.rows,
            "rows_unconfirmed_kept": point.rows_unconfirmed,
            "rows_trimmed": point.rows_dropped}
