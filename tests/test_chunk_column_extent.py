"""A column's extent after each flush is exactly the rows held, for 1-D and 2-D columns.

The recorder resizes every column with new rows at every flush (through HDF5's low-level
``set_extent`` since issue 39): a SWMR reader and a resumed recorder rely on the extent
being the rows written, no more, no fewer, with the row width kept. Real HDF5 files.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from wattlab.runfile.writer import _ChunkColumn, _growable, _uncached

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("width", [None, 2])
def test_extent_is_the_rows_held_after_every_flush(tmp_path: Path, width: int | None) -> None:
    path = tmp_path / "c.h5"
    pieces = [3, 1, 70, 5, 0, 130]  # across the 64-row chunks, whole chunks and tails
    shape = (1,) if width is None else (1, width)
    expected: list[np.ndarray] = []
    with h5py.File(path, "w", libver="latest") as f:
        _growable(f, "col", np.float64, width, chunk_rows=64)
        column = _ChunkColumn(_uncached(f, "col"))
        for i, n in enumerate(pieces):
            size = n * (width or 1)
            data = (np.arange(size, dtype=np.float64) + 1000 * i).reshape((n, *shape[1:]))
            expected.append(data)
            column.append(data)
            column.flush()
            held = np.concatenate(expected)
            assert column.ds.shape == held.shape
            np.testing.assert_array_equal(column.ds[:], held)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["col"][:], np.concatenate(expected))
