"""The run-wide tables (markers, gaps, progress) stay writable through every reopening.

The writer keeps these datasets open between flushes; a source announced after SWMR
started closes and reopens the file, and a resumed file is opened afresh. Real HDF5 files.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor

pytestmark = pytest.mark.fast


def desc(source_id: str) -> SourceDescriptor:
    return SourceDescriptor(source_id, "test", "T", (Channel("power_w", "W"),))


def rows(n: int, start_ns: int = 1_000) -> tuple[np.ndarray, ...]:
    t = start_ns + np.arange(n, dtype=np.int64) * 1_000
    return t, t, np.ones((n, 1)), np.zeros(n, np.uint8)


def write_some(writer: RunFileWriter, source_id: str, label: str) -> None:
    writer.append(source_id, *rows(4))
    writer.add_markers([Marker(2_000, label)])
    writer.add_gaps([Gap(source_id, f"{label} gap", 1, 2, 1_000, 2_000, 3)])
    writer.add_progress([(source_id, 1, 4, False)])
    writer.flush()


def tables(path: Path) -> dict[str, list]:
    with h5py.File(path, "r") as f:
        return {"markers": [bytes(r["name"]).decode() for r in f["markers"][:]],
                "gaps": [bytes(r["reason"]).decode() for r in f["gaps"][:]],
                "progress": [bytes(r["source"]).decode() for r in f["progress"][:]]}


def test_a_source_added_under_swmr_leaves_the_tables_writable(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    writer = RunFileWriter(str(path), {}, 0)
    writer.add_source(desc("a"))
    write_some(writer, "a", "first")
    writer.start_swmr()
    writer.add_source(desc("b"))  # closes and reopens the file
    write_some(writer, "b", "second")
    writer.close(fit_device_clocks=False)
    assert tables(path) == {"markers": ["first", "second"],
                            "gaps": ["first gap", "second gap"], "progress": ["a", "b"]}


def test_a_resumed_file_appends_to_its_tables(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    writer = RunFileWriter(str(path), {}, 0)
    writer.add_source(desc("a"))
    write_some(writer, "a", "before")
    writer.close(fit_device_clocks=False)
    resumed, points = RunFileWriter.resume(str(path), 0)
    assert points["a"].rows == 4
    write_some(resumed, "a", "after")
    resumed.close(fit_device_clocks=False)
    assert tables(path)["markers"] == ["before", "after"]
    assert tables(path)["progress"] == ["a", "a"]
