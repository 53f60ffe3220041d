"""A run whose one stream has times that go backwards: the refusal names the file and stream.

Issue 36, item 4: info, energy and report refused the whole file with "stream time goes
backwards; cannot integrate it", naming neither. What they compute is unchanged (flags at
ingest and the validity verdict are other work); only the words are.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import pytest

from tests.data_files import data_file
from wattlab.cli import main

pytestmark = pytest.mark.fast


@pytest.fixture
def backwards_run(tmp_path: Path) -> Path:
    """demo24.h5 with three rows of gpu0.power in reverse time order."""
    path = tmp_path / "backwards.h5"
    shutil.copy(data_file("demo/demo24.h5"), path)
    with h5py.File(path, "r+") as f:
        time = f["sources/gpu0.power/time"]
        rows = time[10:13]
        time[10:13] = rows[::-1]
    return path


@pytest.mark.parametrize("verb", [["info"], ["report", "-o", "{out}"]], ids=lambda v: v[0])
def test_a_backwards_stream_is_named_with_its_file(verb, backwards_run, tmp_path, capsys):
    # (energy no longer refuses such a file: its validity column says the stream is not
    # valid; that verdict is docs/validity.md's)
    out = tmp_path / "report.html"
    status = main([verb[0], str(backwards_run), *(a.format(out=out) for a in verb[1:])])
    err = capsys.readouterr().err
    assert status != 0, err
    assert "Traceback" not in err
    named = [line for line in err.splitlines() if "time goes backwards" in line]
    assert named and all(f"{backwards_run}: stream gpu0.power: time goes backwards, from "
                         in line for line in named), err
    assert not out.exists()
