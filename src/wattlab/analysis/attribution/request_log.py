"""Per-request logs (wattlab's JSONL, AIPerf's export) and the run's request table.

The table, ``/analysis/requests``, is where `wattlab import requests` stores a log: one
dataset per column (session seconds, NaN where a request had no first token) and
attributes saying where the log came from and how its times were mapped.

wattlab's format (docs/serving.md), one object a line: ``id``, ``start_unix_s``,
``first_token_unix_s`` (or null), ``end_unix_s``, ``prompt_tokens``, ``output_tokens``, and
optionally ``scheduled_unix_s``: when its prefill started (vLLM's ``first_scheduled_time``),
which tells time spent waiting for a place in the batch from prefill.
AIPerf (NVIDIA's serving benchmark) writes one record a line with ``metadata``
(``x_request_id``, ``request_start_ns``/``request_end_ns``: epoch ns) and ``metrics``
(``time_to_first_token`` in ms, ``input_sequence_length``/``output_sequence_length`` in
tokens); its failed records (``error`` set) carry no metrics and are left out, counted.
Times are mapped to the run's timebase by the run's ``session_start_unix_ns``.

Bad input is an error naming the line and the field: a missing or mistyped field, a
duplicate id, a negative token count, an end before the start (or a first token outside
them), a request outside the run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from wattlab.errors import RunFileError, UsageError
from wattlab.runfile import Run, add_record, open_read_only, schema

# NTP slews a wall clock by at most 500 ppm: the run's wall-to-monotonic pairing drifts
# by up to that fraction of the time since the session start
SLEW_PPM = 500.0
FIELDS = ("id", "start_unix_s", "first_token_unix_s", "end_unix_s", "prompt_tokens",
          "output_tokens")


@dataclass(frozen=True)
class Request:
    """One request on the run's timebase (session seconds)."""

    id: str
    start_s: float
    first_token_s: float | None
    end_s: float
    prompt_tokens: int
    output_tokens: int
    scheduled_s: float | None = None  # its prefill's start, where the log says

    @property
    def prefill_start_s(self) -> float:
        """Where its prefill began: when it was scheduled, else (not knowing) its start."""
        return self.start_s if self.scheduled_s is None else self.scheduled_s


Row = tuple[str, float, float | None, float, int, int, float | None]
"""A log line: id, start, first token, end (unix s), prompt and output tokens, scheduled."""


@dataclass
class RequestLog:
    """A log's requests, its format, and what was left out."""

    requests: list[Request]
    format: str
    skipped: int
    mapping: str


def _maybe_number(obj: dict[str, Any], key: str, where: str) -> float | None:
    """A finite number, or None where the field is null."""
    if key not in obj:
        raise UsageError(f"{where}: field {key!r} is missing")
    return None if obj[key] is None else _number(obj, key, where)


def _number(obj: dict[str, Any], key: str, where: str) -> float:
    if key not in obj:
        raise UsageError(f"{where}: field {key!r} is missing")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise UsageError(f"{where}: field {key!r} must be a finite number, got {v!r}")
    return float(v)


def _tokens(obj: dict[str, Any], key: str, where: str) -> int:
    v = _number(obj, key, where)
    if v < 0 or v != int(v):
        raise UsageError(f"{where}: field {key!r} must be a whole number >= 0, got {obj[key]!r}")
    return int(v)


def _wattlab_row(obj: dict[str, Any], where: str) -> Row:
    if not isinstance(obj.get("id"), str) or not obj["id"]:
        raise UsageError(f"{where}: field 'id' must be a non-empty string, got "
                         f"{obj.get('id')!r}")
    start = _number(obj, "start_unix_s", where)
    first = _maybe_number(obj, "first_token_unix_s", where)
    end = _number(obj, "end_unix_s", where)
    return (obj["id"], start, first, end, _tokens(obj, "prompt_tokens", where),
            _tokens(obj, "output_tokens", where),
            None if obj.get("scheduled_unix_s") is None else _number(obj, "scheduled_unix_s",
                                                                      where))


def _aiperf_row(obj: dict[str, Any], where: str) -> Row | None:
    meta, metrics = obj.get("metadata"), obj.get("metrics") or {}
    if not isinstance(meta, dict) or not isinstance(metrics, dict):
        raise UsageError(f"{where}: field 'metadata' must be an object")
    if obj.get("error") is not None:
        return None
    start = _number(meta, "request_start_ns", f"{where} metadata")
    end = _number(meta, "request_end_ns", f"{where} metadata")
    ttft = metrics.get("time_to_first_token")
    first = None
    if isinstance(ttft, dict):
        ms = _number(ttft, "value", f"{where} metrics.time_to_first_token")
        first = start / 1e9 + ms / 1e3
    counts = {}
    for key in ("input_sequence_length", "output_sequence_length"):
        m = metrics.get(key)
        if not isinstance(m, dict):
            raise UsageError(f"{where}: field 'metrics.{key}' is missing")
        counts[key] = _tokens(m, "value", f"{where} metrics.{key}")
    rid = str(meta.get("x_request_id") or meta.get("session_num", where))
    return (rid, start / 1e9, first, end / 1e9, counts["input_sequence_length"],
            counts["output_sequence_length"], None)


def parse_request_log(path: str, lines: Sequence[str], session_start_unix_ns: int,
                      run_span_s: tuple[float, float]) -> RequestLog:
    """Read and check a log (module doc); times in session seconds."""
    fmt, skipped = "", 0
    rows: list[tuple[str, Row]] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{where}: not JSON ({e.msg})") from e
        if not isinstance(obj, dict):
            raise UsageError(f"{where}: not a JSON object")
        fmt = fmt or ("aiperf" if "metadata" in obj else "wattlab")
        row = _aiperf_row(obj, where) if fmt == "aiperf" else _wattlab_row(obj, where)
        if row is None:
            skipped += 1
            continue
        if row[0] in seen:
            raise UsageError(f"{where}: field 'id': {row[0]!r} is a duplicate of line "
                             f"{seen[row[0]]}")
        seen[row[0]] = n
        rows.append((where, row))
    if not rows:
        raise UsageError(f"{path}: no request in the log")
    t0 = session_start_unix_ns / 1e9
    out = [_mapped(where, row, t0, run_span_s) for where, row in rows]
    return RequestLog(out, fmt, skipped, mapping_text())


def mapping_text() -> str:
    """How wall-clock times were put on the run's timebase, and how well."""
    return (f"session seconds = unix seconds - session_start_unix_ns / 1e9; ± {SLEW_PPM:g} ppm "
            "of the time since the session start (wall-clock slew), plus the log's own clock "
            "offset against this host's")


def _mapped(where: str, row: Row, t0: float, span_s: tuple[float, float]) -> Request:
    rid, start, first, end, prompt, output, scheduled = row
    start_s, end_s = start - t0, end - t0
    first_s = None if first is None else first - t0
    scheduled_s = None if scheduled is None else scheduled - t0
    if end_s < start_s:
        raise UsageError(f"{where}: field 'end_unix_s' ({end:.6f}) is before the start "
                         f"({start:.6f})")
    if first_s is not None and not start_s <= first_s <= end_s:
        raise UsageError(f"{where}: field 'first_token_unix_s' is outside the request's "
                         "start..end")
    if scheduled_s is not None and not start_s <= scheduled_s <= (
            end_s if first_s is None else first_s):
        raise UsageError(f"{where}: field 'scheduled_unix_s' is outside the request's start.."
                         + ("end" if first_s is None else "first token"))
    slack = SLEW_PPM * 1e-6 * max(abs(end_s), 1.0)
    if start_s < span_s[0] - slack or end_s > span_s[1] + slack:
        raise UsageError(f"{where}: request {rid!r} ({start_s:.3f}..{end_s:.3f} s) lies outside "
                         f"the run ({span_s[0]:.3f}..{span_s[1]:.3f} s since its start): "
                         "another run's log, or another host's clock")
    return Request(rid, start_s, first_s, end_s, prompt, output, scheduled_s)


WHERE = (schema.REQUESTS,)
COLUMNS = schema.REQUEST_COLUMNS


def write_requests(path: str, log_path: str, log: RequestLog) -> str:
    """Store ``log`` in the run file at ``path`` (replacing an older table); its group path."""
    def fill(group: h5py.Group) -> None:
        reqs = log.requests
        group.create_dataset(schema.REQUEST_ID, data=[r.id for r in reqs],
                             dtype=h5py.string_dtype())
        def maybe(xs: list[float | None]) -> list[float]:
            return [math.nan if x is None else x for x in xs]

        columns = ([r.start_s for r in reqs], maybe([r.first_token_s for r in reqs]),
                   [r.end_s for r in reqs], [r.prompt_tokens for r in reqs],
                   [r.output_tokens for r in reqs], maybe([r.scheduled_s for r in reqs]))
        for name, values in zip((*COLUMNS, schema.REQUEST_SCHEDULED), columns, strict=True):
            group[name] = np.array(values)  # floats stay float64, token counts int64
        group.attrs.update(dict(zip(schema.REQUEST_ATTRS, (
            os.path.basename(log_path), log.format, log.skipped, log.mapping), strict=True)))

    return add_record(path, WHERE, fill)


def read_requests(run: Run) -> tuple[list[Request], dict[str, str]] | None:
    """The run's request table and its attributes; None where it has none."""
    with open_read_only(run.path) as f:
        group = f.get("/".join(("", schema.ANALYSIS, *WHERE)))
        if group is None:
            return None
        try:
            ids = [x.decode() if isinstance(x, bytes) else str(x)
                   for x in group[schema.REQUEST_ID][()]]
            cols = [group[c][()] for c in COLUMNS]
            attrs = {k: str(v) for k, v in group.attrs.items()}
        except KeyError as e:
            raise RunFileError(f"{run.path}: the request table is incomplete ({e})") from e
        scheduled = (group[schema.REQUEST_SCHEDULED][()] if schema.REQUEST_SCHEDULED in group
                     else np.full(len(ids), math.nan))

    def maybe(x: float) -> float | None:
        return None if math.isnan(x) else float(x)

    return [Request(i, float(a), maybe(b), float(c), int(d), int(e), maybe(f))
            for i, a, b, c, d, e, f in zip(ids, *cols, scheduled, strict=True)], attrs
