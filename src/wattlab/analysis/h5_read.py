"""Open an HDF5 file for reading the one way every reader in wattlab does.

Without a file lock, so that no reader (a live view, an analysis of a file still being
recorded) can stop the recorder from reopening the file; and the same way everywhere,
because HDF5 refuses a second handle on a file whose locking flag differs from the first
("file locking flag values don't match") — which is why the writers (sync/run_writer.py,
calibration records, sweep files) open without a lock too. A second writer is kept out by
O_EXCL creation instead: only the session's own supervisor ever reopens a run to write.
"""

from __future__ import annotations

import h5py

from wattlab.errors import RunFileError


def open_read_only(path: str, *, swmr: bool = True) -> h5py.File:
    """SWMR read where the file allows it (a live run), else a plain read; no lock."""
    if swmr:
        try:
            return h5py.File(path, "r", libver="latest", swmr=True, locking=False)
        except OSError:
            pass
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as e:
        raise RunFileError(f"{path}: not a readable HDF5 file ({e})") from e
