"""The layer record in a run file: ``/analysis/layers``, as `wattlab layers --store` leaves it.

Why in the run file: the report draws it beside the run's power, and the record (counts,
measurements, plans) travels with the data it explains.
"""

from __future__ import annotations

import json
from typing import Any

import h5py

from wattlab.runfile import schema
from wattlab.runfile.h5_read import open_read_only
from wattlab.runfile.records import add_record


def write_layers(path: str, record: dict[str, Any]) -> None:
    """Store (or replace) the record (the layer study's JSON document)."""
    def fill(group: h5py.Group) -> None:
        group.attrs[schema.RECORD_JSON] = json.dumps(record)

    add_record(path, (schema.LAYERS,), fill)


def read_layers(path: str) -> dict[str, Any] | None:
    """The stored layer record, or None."""
    with open_read_only(path) as f:
        g = f.get(f"{schema.ANALYSIS}/{schema.LAYERS}")
        return None if g is None else json.loads(g.attrs[schema.RECORD_JSON])
