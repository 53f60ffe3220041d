"""Calibration records in a run file: ``/analysis/calibration/<source>:<channel>``.

Why in the run file: a calibration belongs to the recording it was fitted on, and the
report shows the stored ones beside it. The record (the JSON document `wattlab calibrate`
makes) is kept whole; its kernel, identifiability and pinned parameters are repeated as
attributes so that HDF5 tools show them without parsing JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import h5py

from wattlab.runfile import schema
from wattlab.runfile.h5_read import open_read_only
from wattlab.runfile.records import add_record


@dataclass(frozen=True)
class StoredCalibration:
    """One stream's calibration as the run file keeps it."""

    source: str
    channel: str
    kernel: str
    identifiable: bool
    params: dict[str, float]  # the fitted parameters the data pinned, by name
    record: dict[str, Any]  # the whole record, stored as JSON

    @property
    def key(self) -> str:
        """The record's group name: ``<source>:<channel>``."""
        return f"{self.source}:{self.channel}"


def write_calibration(path: str, calibration: StoredCalibration, *, hint: str = "") -> str:
    """Store (or replace) one stream's calibration; the group's path in the file."""
    def fill(group: h5py.Group) -> None:
        group.attrs[schema.RECORD_JSON] = json.dumps(calibration.record, sort_keys=True)
        group.attrs[schema.KERNEL] = calibration.kernel
        group.attrs[schema.IDENTIFIABLE] = calibration.identifiable
        for name, value in calibration.params.items():
            group.attrs[name] = value

    return add_record(path, (schema.CALIBRATION, calibration.key), fill, hint=hint)


def read_calibrations(path: str) -> list[dict[str, Any]]:
    """The calibration records (JSON documents) stored in a run file, in key order."""
    with open_read_only(path) as f:
        group = f.get(f"{schema.ANALYSIS}/{schema.CALIBRATION}")
        if group is None:
            return []
        return [json.loads(group[key].attrs[schema.RECORD_JSON]) for key in group]
