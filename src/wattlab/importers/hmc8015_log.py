"""Import an HMC8015's own on-device log (CSV fetched with ``DATA:DATA?``) as a run stream.

Lives in ``acquisition`` because the log format belongs to the instrument's driver (and
``analysis`` never imports drivers); `wattlab import hmc8015-log` adds it to the formats.
Log times are times of day; the ``#Date`` header line (when present) places them on the
calendar, else they count from the log's own midnight.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from wattlab.drivers.hmc8015 import parse_log_csv
from wattlab.errors import MeterProtocolError, RunFileError
from wattlab.importers.power_logs import Imported, ImportedSource
from wattlab.samples import SourceDescriptor


def read_hmc8015_log(path: Path, name: str) -> Imported:
    try:
        log = parse_log_csv(path.read_bytes(), str(path))
    except MeterProtocolError as e:
        raise RunFileError(str(e)) from e
    if log.time_of_day_s.size == 0:
        raise RunFileError(f"{path}: the log holds no readings")
    midnight_ns = 0
    date = log.metadata.get("Date")
    if date:
        try:
            day = dt.datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=dt.UTC)
        except ValueError as e:
            raise RunFileError(f"{path}: #Date {date!r} is not YYYY-MM-DD") from e
        midnight_ns = int(day.timestamp()) * 1_000_000_000
    t_ns = midnight_ns + np.round(log.time_of_day_s * 1e9).astype(np.int64)
    descriptor = SourceDescriptor(
        source_id=name, kind="hmc8015", model="HMC8015", channels=tuple(log.channels),
        serial=log.metadata.get("Serial", ""), transport="import:hmc8015-log",
        time_raw="unix_ns" if date else "ns_since_log_midnight",
        config={"imported_from": str(path), "import_format": "hmc8015-log",
                "functions": log.functions, "log_metadata": log.metadata},
    )
    return Imported([ImportedSource(descriptor, t_ns, log.values, flags=log.flags)])
