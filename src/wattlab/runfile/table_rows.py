"""Rows of the run-wide tables (``/markers``, ``/gaps``, ``/progress``) from what was sent.

Why apart from the writer: each row type is the schema's, filled field by field on the
session timebase; the writer only appends them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.runfile import schema
from wattlab.samples import Gap, Marker


def session_time_ns(t_host_ns: int, session_start_ns: int) -> int:
    """A host time on the session timebase; an unknown one (negative) stays unknown."""
    return int(schema.UNKNOWN_TIME_NS) if t_host_ns < 0 else t_host_ns - session_start_ns


def marker_rows(markers: list[Marker], dtype: np.dtype[Any],
                session_start_ns: int) -> npt.NDArray[Any]:
    """``dtype``: the file's own row type (a file from before the GPU-time columns too)."""
    rows = np.zeros(len(markers), dtype=dtype)
    gpu_columns = schema.TIME_GPU in (rows.dtype.names or ())
    for i, m in enumerate(markers):
        row = rows[i]
        row[schema.TIME] = m.t_host_ns - session_start_ns
        row[schema.TIME_RAW] = m.t_host_ns
        row[schema.KIND] = m.kind.encode()
        row[schema.SOURCE] = m.source.encode()[:schema.SOURCE_ID_BYTES]
        row[schema.NAME] = m.name.encode()
        row[schema.PAYLOAD] = m.payload_json().encode()
        if gpu_columns:
            gpu = m.t_gpu_ns is not None
            row[schema.TIME_GPU] = (m.t_gpu_ns - session_start_ns  # type: ignore[operator]
                                    if gpu else schema.UNKNOWN_TIME_NS)
            row[schema.TIME_GPU_UNCERTAINTY] = (m.gpu_uncertainty_ns or 0) if gpu else -1
    return rows


def gap_rows(gaps: list[Gap], session_start_ns: int) -> npt.NDArray[Any]:
    rows = np.zeros(len(gaps), dtype=schema.GAP_DTYPE)
    for i, g in enumerate(gaps):
        rows[i] = (
            g.source.encode()[:schema.SOURCE_ID_BYTES],
            g.seq_first,
            g.seq_last,
            session_time_ns(g.t_first_ns, session_start_ns),
            session_time_ns(g.t_last_ns, session_start_ns),
            g.samples_lost,
            g.reason.encode()[:schema.REASON_BYTES],
        )
    return rows


def progress_rows(rows: list[tuple[str, int, int, bool]]) -> npt.NDArray[Any]:
    """(source, next sequence number, rows written, ended) as ``/progress`` rows."""
    table = np.zeros(len(rows), dtype=schema.PROGRESS_DTYPE)
    for i, (source_id, seq_next, count, ended) in enumerate(rows):
        table[i] = (source_id.encode()[:schema.SOURCE_ID_BYTES], seq_next, count, ended)
    return table
