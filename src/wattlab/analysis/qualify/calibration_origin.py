"""Whether a calibration record came from the run it would be scored on.

Why: a calibration fitted on the very windows it is then scored on agrees with the
reference by construction; MLPerf-style qualification of calibrated NVML needs the
calibration from a different run. A run's identity is its host and session start (unix
ns), which a copy or a renamed file keeps.
"""

from __future__ import annotations

import os

from wattlab.errors import RunFileError
from wattlab.runfile import CalibrationRecord, Run, schema


def run_identity(run: Run) -> tuple[str, int] | None:
    """(host, session start in unix ns) of a run, None for a file without them."""
    attrs = run.attrs
    if schema.HOST not in attrs or schema.SESSION_START_UNIX_NS not in attrs:
        return None
    return str(attrs[schema.HOST]), int(attrs[schema.SESSION_START_UNIX_NS])


def same_run(run: Run, record: CalibrationRecord) -> str | None:
    """Why the record is from ``run`` (None: it is from another run, as far as one can tell)."""
    if os.path.realpath(record.run) == os.path.realpath(run.path):
        return f"it was fitted on {record.run}, the run being scored"
    if not os.path.exists(record.run):
        return None
    try:
        with Run(record.run) as origin:
            theirs = run_identity(origin)
    except (RunFileError, OSError):
        return None
    ours = run_identity(run)
    if ours is not None and ours == theirs:
        return (f"it was fitted on {record.run}, the same recording as {run.path} (host "
                f"{ours[0]}, session start {ours[1]} ns)")
    return None
