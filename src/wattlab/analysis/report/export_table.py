"""A tidy table of many runs' energies: one row per run × stream channel × phase.

Why tidy: pandas, polars, DuckDB and spreadsheets group and pivot a long table with
one value per row directly, where nested JSON needs code. The figures are exactly
``wattlab energy --by-marker``'s (the whole run, then every marked phase), each with its
validity verdict (``valid``, ``failed_checks``). CSV always
works; Parquet (typed, compressed) needs pyarrow, an optional dependency.

A stream's channels are parts and readings of one draw (a PowerSensor3's pairs and their
total, an NVML stream's instant and averaged power): summed, they count it twice or more.
``stream_total`` marks the one channel per stream whose energy is the stream's (the one
``wattlab info`` integrates), so ``WHERE stream_total`` gives one energy per stream.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from wattlab.errors import UsageError
from wattlab.runfile import schema

# column -> type (pyarrow's name); every value a plain str/int/float or None
COLUMNS: dict[str, str] = {
    "run": "string", "created": "string", "host": "string",
    "source": "string", "channel": "string", "stream_total": "bool", "method": "string",
    "kind": "string", "model": "string", schema.REMOTE_HOST: "string",  # the stream's attribute
    "phase": "string", "t0_s": "float64", "t1_s": "float64", "duration_s": "float64",
    "energy_j": "float64", "uncertainty_j": "float64", "low_j": "float64", "high_j": "float64",
    "mean_power_w": "float64", "covered_s": "float64", "uncovered_s": "float64",
    "gaps": "int64", "reference": "string", "error_pct": "float64", "resolves": "bool",
    "valid": "bool", "failed_checks": "string",
}
FORMATS = ("csv", "parquet")


def tidy_rows(path: str) -> list[dict[str, Any]]:
    """The rows of one run file (a worker's job when there are many)."""
    from wattlab.analysis.alignment import power_channel
    from wattlab.analysis.energy import energy_channel, energy_report
    from wattlab.runfile import Run

    with Run(path) as run:
        report = energy_report(run, by_marker=True)
        attrs = run.attrs
        views = run.sources
        about = {sid: (v.kind, v.model, v.remote_host) for sid, v in views.items()}
        totals = {sid: power_channel(v) or energy_channel(v) for sid, v in views.items()}
    out = []
    for r in report["rows"]:
        kind, model, remote = about[r["source"]]
        out.append({
            "run": path, "created": str(attrs.get(schema.CREATED, "")),
            "host": str(attrs.get(schema.HOST, "")), "source": r["source"], "channel": r["channel"],
            "stream_total": r["channel"] == totals[r["source"]], "method": r["method"],
            "kind": kind, "model": model, schema.REMOTE_HOST: remote,
            "phase": r["phase"], "t0_s": r["t0_s"], "t1_s": r["t1_s"],
            "duration_s": r["t1_s"] - r["t0_s"],
            **{k: r[k] for k in ("energy_j", "uncertainty_j", "low_j", "high_j", "mean_power_w",
                                 "covered_s", "uncovered_s", "gaps", "error_pct", "resolves")},
            "reference": report["reference"] or "",
            # the verdict (docs/validity.md): the names of the checks failed, space-separated
            "valid": r["valid"],
            "failed_checks": " ".join(k for k, c in r["checks"].items() if not c["ok"]),
        })
    return out


def format_of(output: str, given: str | None) -> str:
    """The table format: as given, else from the output's suffix."""
    fmt = given or Path(output).suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise UsageError(f"{output}: say --format csv or --format parquet (the name's suffix "
                         f"{Path(output).suffix!r} says neither)")
    return fmt


class TableWriter:
    """Appends blocks of rows to a CSV or Parquet file; memory: one block at a time.

    ``columns``: column -> pyarrow type (default: the energy table's ``COLUMNS``).
    """

    def __init__(self, output: str, fmt: str, columns: dict[str, str] | None = None) -> None:
        self.output = output
        columns = columns or COLUMNS
        self.rows = 0
        self._csv: Any = None
        self._parquet: Any = None
        if fmt == "parquet":
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError as e:
                raise UsageError("--format parquet needs pyarrow: pip install "
                                 "'wattlab[parquet]' (or use --format csv)") from e
            self._schema = pa.schema([(k, pa.type_for_alias(t)) for k, t in columns.items()])
            self._parquet = pq.ParquetWriter(output, self._schema)
            self._pa = pa
        else:
            self._file = open(output, "x", newline="", encoding="utf-8")  # noqa: SIM115
            self._csv = csv.DictWriter(self._file, fieldnames=list(columns))
            self._csv.writeheader()

    def write(self, rows: Iterable[dict[str, Any]]) -> None:
        block = list(rows)
        self.rows += len(block)
        if self._parquet is not None:
            if block:
                self._parquet.write_table(self._pa.Table.from_pylist(block, self._schema))
        else:
            self._csv.writerows({k: "" if v is None else v for k, v in r.items()} for r in block)

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
        else:
            self._file.close()
