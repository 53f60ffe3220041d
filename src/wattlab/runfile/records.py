"""Adding an analysis record to a run file: the group ``/analysis/<name>``, created or replaced.

Why one way for every record (calibration, layers, tuning): each must refuse a file that is
being recorded (its recorder owns it) or was left open by a crash (HDF5 refuses to write it
until `wattlab repair`), open it as every other wattlab writer does (no file lock:
runfile/h5_read.py says why), and replace an older record of the same name instead of
failing or keeping both.
"""

from __future__ import annotations

from collections.abc import Callable

import h5py

from wattlab.errors import RunFileError
from wattlab.runfile import schema
from wattlab.runfile.repair import writer_status


def add_record(path: str, where: tuple[str, ...], fill: Callable[[h5py.Group], None], *,
               hint: str = "") -> str:
    """Create (or replace) the group ``/analysis/<where...>``, ``fill`` it; its path.

    ``hint``: what else the caller's user can do, added to a refusal.
    """
    target = "/".join(("", schema.ANALYSIS, *where))
    status = writer_status(path)
    if status.open:
        raise RunFileError(f"cannot add {target}: {status.describe(path)}{hint}")
    try:
        with h5py.File(path, "r+", locking=False) as f:
            parent = f.require_group(schema.ANALYSIS)
            for part in where[:-1]:
                parent = parent.require_group(part)
            if where[-1] in parent:
                del parent[where[-1]]
            fill(parent.create_group(where[-1]))
    except (OSError, ValueError) as e:
        raise RunFileError(f"{path}: cannot add {target}: {e}") from e
    return target
