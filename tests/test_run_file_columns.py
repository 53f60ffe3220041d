"""Columns of a run read as whole rows (the run is opened without HDF5's chunk cache).

A real run file from wattlab's writer: a 3-channel stream over several chunks; every way
of reading one channel must give what h5py reads from the dataset directly.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from wattlab.runfile import reader as run_file
from wattlab.runfile.reader import Run
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, SourceDescriptor

pytestmark = pytest.mark.fast

T0 = 1_000_000_000_000
ROWS = 50_000
NAMES = ("current_a", "voltage_v", "power_w")


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("columns") / "run.h5"
    writer = RunFileWriter(str(out), {"command": "[]", "host": "test"}, T0)
    writer.add_source(SourceDescriptor("meter", "power_analyser", "Test meter",
                                       tuple(Channel(n, u) for n, u in zip(
                                           NAMES, ("A", "V", "W"), strict=True)),
                                       value_dtype="<f4"))
    rng = np.random.default_rng(5)
    for part in np.array_split(np.arange(ROWS), 5):
        t_ns = T0 + part.astype(np.int64) * 50_000
        writer.append("meter", t_ns, t_ns, rng.normal(size=(part.size, 3)).astype(np.float32),
                      np.zeros(part.size, np.uint8))
    writer.close({"session_end_monotonic_ns": T0 + ROWS * 50_000})
    return out


def test_every_way_of_reading_a_channel_matches_h5py(path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_file, "COLUMN_READ_BYTES", 7_000)  # many slices, uneven borders
    with h5py.File(path, "r") as f:
        values = f["sources/meter/values"][()]
        times = f["sources/meter/time"][()]
    with Run(str(path)) as run:
        view = run.source("meter")
        assert view._ds["values"].chunks[0] < ROWS  # the stream spans several chunks
        for col, name in enumerate(NAMES):
            np.testing.assert_array_equal(view.channel(name), values[:, col])
            np.testing.assert_array_equal(view.column_slice(name, 1234, 40_321),
                                          values[1234:40_321, col])
            np.testing.assert_array_equal(view.column_slice(name, -10, ROWS),
                                          values[-10:, col])
            got = list(view.iter_chunks(name, rows=9_999))
            np.testing.assert_array_equal(np.concatenate([t for t, _ in got]), times)
            np.testing.assert_array_equal(np.concatenate([v for _, v in got]), values[:, col])
        assert view.column_slice("power_w", 10, 10).size == 0
