"""A full disk (ENOSPC, EDQUOT, EFBIG) ends a recording cleanly instead of crashing it.

Why a separate process finishes the file: after a failed write the HDF5 library's state
in the recorder is not to be trusted (closing it wrote more half-blocks and once crashed
with SIGSEGV). The recorder therefore stops at the first such error and replaces itself
(``exec``) with this module, which never had the file open: it frees the reserve the
recorder set aside next to the run file, clears the crash flags (the SWMR file is
consistent as its last flush left it), and, when there is room, reopens the file, cuts
every stream back to its last complete flush (what a restarted recorder does), adds one
``/gaps`` row per stream for the lost span and closes it normally. It prints the one
line the user reads and a JSON report on stdout for the session, and exits with
``DISK_FULL_EXIT`` so the supervisor does not start a recorder into the same disk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

DISK_FULL_EXIT = 74  # sysexits.h EX_IOERR; a crash is 1, a usage error 2
DISK_FULL_ERRNOS = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT", errno.EFBIG: "EFBIG"}
RESERVE_BYTES = 1 << 20  # room to finish the file: cut, gap rows, final attributes
TAIL_ROWS = 64  # a stream's last rows: enough for its usual step
REPORT_PREFIX = "wattlab-disk-full "  # the JSON report's line on stdout
_ERRNO_IN_TEXT = re.compile(r"errno = (\d+)")  # how HDF5 names the system error


def disk_full_error(exc: BaseException) -> str | None:
    """The errno name if ``exc`` (or what caused it) says the disk is full, else None.

    h5py raises RuntimeError or OSError whose text carries HDF5's ``errno = N``; Python's
    own writes raise OSError with ``errno`` set.
    """
    seen: BaseException | None = exc
    while seen is not None:
        code = getattr(seen, "errno", None)
        if isinstance(code, int) and code in DISK_FULL_ERRNOS:
            return DISK_FULL_ERRNOS[code]
        match = _ERRNO_IN_TEXT.search(str(seen))
        if match and int(match.group(1)) in DISK_FULL_ERRNOS:
            return DISK_FULL_ERRNOS[int(match.group(1))]
        seen = seen.__cause__ or seen.__context__
    return None


def reserve_path(output: str) -> str:
    """The reserve file, beside the run file (same file system, same quota)."""
    folder, name = os.path.split(os.path.abspath(output))
    return os.path.join(folder, f".{name}.reserve")


def make_reserve(output: str, size_bytes: int = RESERVE_BYTES) -> None:
    """Set space aside for finishing the file after the disk fills (kept if already there).

    ``posix_fallocate`` allocates real blocks (zeros written where the file system cannot
    allocate): a sparse file would free nothing.
    """
    path = reserve_path(output)
    if os.path.exists(path) and os.path.getsize(path) >= size_bytes:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)


def free_reserve(output: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(reserve_path(output))


@dataclass
class LostSpan:
    """One stream's loss: from its last row in the file to the failure (session seconds)."""

    source: str
    last_row_s: float | None  # None: the file holds no row of it
    seq_next: int
    row_interval_s: float | None = None  # its usual step: no row was due before last + step


@dataclass
class DiskFullReport:
    """What the session learns from the finished file (also the JSON on stdout)."""

    output: str
    error: str  # ENOSPC, EDQUOT or EFBIG
    failed_at_s: float  # session seconds
    held_until_s: float | None  # every live stream is in the file up to here
    spans: list[LostSpan] = field(default_factory=list)
    in_gaps: bool = False  # the spans are rows of /gaps
    finished: bool = False  # cut back, gap rows and final attributes written, closed
    problem: str = ""  # why the file could not be finished, if it could not

    def line(self) -> str:
        """The one line printed when the recording stops."""
        held = ("nothing" if self.held_until_s is None
                else f"everything up to {self.held_until_s:.1f} s")
        return (f"disk full at {self.failed_at_s:.1f} s: recording stopped; the file holds "
                f"{held}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DiskFullReport:
        data = json.loads(text)
        data["spans"] = [LostSpan(**s) for s in data["spans"]]
        return cls(**data)


@dataclass
class SealRequest:
    """What the recorder hands over when it stops (its argv after ``exec``)."""

    output: str
    session_start_ns: int
    failed_at_ns: int
    error: str

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "wattlab.sync.recorder.disk_full_seal",
                json.dumps(asdict(self))]


def stop_recording(request: SealRequest) -> None:
    """Replace this process with the finishing step; nothing of its HDF5 state survives."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = request.argv()
    os.execv(argv[0], argv)


def room_bytes(output: str, written: int = 0) -> int:
    """Bytes this process may still add to ``output`` (``written`` bytes long already).

    The free space in its folder, and what ``ulimit -f`` leaves.
    """
    stat = os.statvfs(os.path.dirname(os.path.abspath(output)))
    room = stat.f_bavail * stat.f_frsize
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY:
        room = min(room, max(0, limit - written))
    return room


def seal(request: SealRequest) -> DiskFullReport:
    """Make the file consistent and record the loss in it where there is room.

    If finishing fails half-way this process ends at once (HDF5 must not close what it
    could not write), after saying so.
    """
    from wattlab.runfile import clear_crash_flags, fit_eoa_to_file

    report = DiskFullReport(request.output, request.error,
                            (request.failed_at_ns - request.session_start_ns) / 1e9, None)
    free_reserve(request.output)
    try:  # both in place: they need no room
        clear_crash_flags(request.output)
        fit_eoa_to_file(request.output)
    except Exception as e:  # said in the line: the session must still end cleanly
        report.problem = f"could not clear the file's crash flags: {e}"
        return report
    room = room_bytes(request.output, os.path.getsize(request.output)) >= RESERVE_BYTES // 2
    if not room:
        report.problem = "no room left for the /gaps rows"
    try:
        _finish(request, report, room)
    except Exception as e:
        # the reopened file may hold half-written metadata: it stays marked open, as after
        # a crash, for `wattlab repair` once there is room
        report.problem = f"could not finish it: {_short(e)}; `wattlab repair` it later"
        _exit(report)
    return report


def _finish(request: SealRequest, report: DiskFullReport, room: bool) -> None:
    from wattlab.runfile import (
        DISK_FULL_JSON,
        SESSION_END_MONOTONIC_NS,
        STOPPED_BY,
        RunFileWriter,
        unreadable_gaps,
    )
    from wattlab.samples import Gap

    # nothing will be resent: keep every row all of a stream's datasets hold whole
    writer, points = RunFileWriter.resume(request.output, request.session_start_ns,
                                          keep_unconfirmed=True, stamp_writer=room)
    gaps = unreadable_gaps(writer, f"disk full ({request.error})", request.failed_at_ns)
    for source_id, point in sorted(points.items()):
        tail = writer.last_times_ns(source_id, TAIL_ROWS)
        last_ns = int(tail[-1]) if len(tail) else None
        report.spans.append(_span(source_id, tail, point.seq_next))
        if not point.ended:
            # a stream that never had a row written: from the session's start
            t_first = request.session_start_ns + (0 if last_ns is None else last_ns)
            gaps.append(Gap(source_id, f"disk full ({request.error}): recording stopped",
                            point.seq_next, -1, t_first, request.failed_at_ns))
    report.spans = [s for s in report.spans if not points[s.source].ended]
    report.held_until_s = _held_until(report.spans, report.failed_at_s)
    if not room:  # the cut only: it rewrites in place; repair finishes it once there is room
        writer.close(finished=False)
        return
    if gaps:
        writer.add_gaps(gaps)
    writer.close({SESSION_END_MONOTONIC_NS: time.monotonic_ns(),
                  STOPPED_BY: f"disk full ({request.error})",
                  DISK_FULL_JSON: report.to_json()})
    report.in_gaps = bool(gaps)
    report.finished = True


def _span(source_id: str, tail_ns: Any, seq_next: int) -> LostSpan:
    """A stream's span from the session times of its last rows in the file."""
    if len(tail_ns) == 0:
        return LostSpan(source_id, None, seq_next)
    step = float(np.median(np.diff(tail_ns))) / 1e9 if len(tail_ns) > 1 else None
    return LostSpan(source_id, float(tail_ns[-1]) / 1e9, seq_next, step)


def _held_until(spans: list[LostSpan], failed_at_s: float) -> float | None:
    """Up to when every stream is complete: a stream is, until its next row was due.

    A sparse stream (an energy counter read every 9 s) is not missing anything before its
    next reading. A stream with a single row has no known step: it counts only when no
    stream has one.
    """
    due = [s.last_row_s + s.row_interval_s for s in spans
           if s.last_row_s is not None and s.row_interval_s is not None]
    due = due or [s.last_row_s for s in spans if s.last_row_s is not None]
    return min(*due, failed_at_s) if due else None


def _short(exc: BaseException) -> str:
    name = disk_full_error(exc)
    return f"the disk is still full ({name})" if name else str(exc).splitlines()[0][:200]


def _emit(report: DiskFullReport) -> None:
    """The user's line on stderr, the session's report on stdout (either may be gone)."""
    extra = f" ({report.problem})" if report.problem else ""
    for stream, text in ((sys.stderr, f"wattlab: {report.line()}{extra}"),
                         (sys.stdout, REPORT_PREFIX + report.to_json())):
        with contextlib.suppress(OSError):
            print(text, file=stream, flush=True)


def _exit(report: DiskFullReport) -> None:
    """End now, without letting HDF5 close (and write) a file that failed mid-write."""
    _emit(report)
    os._exit(DISK_FULL_EXIT)


def read_report(text: str) -> DiskFullReport | None:
    """The report among a finishing step's stdout lines (None if it printed none)."""
    for line in text.splitlines():
        if line.startswith(REPORT_PREFIX):
            return DiskFullReport.from_json(line[len(REPORT_PREFIX):])
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    request = SealRequest(**json.loads(args[0]))
    _emit(seal(request))
    return DISK_FULL_EXIT

