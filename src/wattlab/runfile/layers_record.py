"""The layer record in a run file: ``/analysis/layers``, as `wattlab layers --store` leaves it.

Why in the run file: the report draws it beside the run's power, and the record (counts,
measurements, plans) travels with the data it explains.
"""

from __future__ import annotations

import json
from typing import Any

import h5py

from wattlab.errors import RunFileError
from wattlab.runfile.h5_read import open_read_only


def write_layers(path: str, record: dict[str, Any]) -> None:
    """Store (or replace) the record under ``/analysis/layers`` as JSON."""
    try:
        with h5py.File(path, "r+", locking=False) as f:
            g = f.require_group("analysis")
            if "layers" in g:
                del g["layers"]
            g.create_group("layers").attrs["record_json"] = json.dumps(record)
    except (OSError, ValueError) as e:
        raise RunFileError(f"{path}: cannot add /analysis/layers: {e}") from e


def read_layers(path: str) -> dict[str, Any] | None:
    """The stored layer record, or None."""
    with open_read_only(path) as f:
        g = f.get("analysis/layers")
        return None if g is None else json.loads(g.attrs["record_json"])
