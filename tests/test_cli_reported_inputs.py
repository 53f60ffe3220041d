"""Each bad input issue 36 reported (items 9 and 12), replayed through ``wattlab.cli.main``.

tests/test_cli_bad_input.py covers the whole matrix; this file keeps the reported commands
word for word, with what each used to do, so a regression names the report it undoes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.data_files import data_file
from wattlab.cli import main

pytestmark = pytest.mark.fast


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    run = tmp_path / "run.h5"
    shutil.copy(data_file("demo/demo24.h5"), run)
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1, 2, 3]
    text = tmp_path / "notes.txt"
    text.write_text("not a run file\n")
    empty = tmp_path / "empty.npz"
    empty.touch()
    npy = tmp_path / "one.npy"
    np.save(npy, np.zeros(3))
    list_meta = tmp_path / "list_meta.npz"
    np.savez(list_meta, samples=np.zeros((2, 3), np.int64), average=np.zeros((2, 2), np.int64),
             meta=np.array(json.dumps([1, 2])))
    folder = tmp_path / "adir"
    folder.mkdir()
    return {"run": str(run), "foreign": str(foreign), "text": str(text), "empty": str(empty),
            "npy": str(npy), "list_meta": str(list_meta), "folder": str(folder),
            "new": str(tmp_path / "new")}


CALIBRATE = ["calibrate", "{run}", "--reference", "ps3", "--target", "gpu0.power"]
ITERATIONS = ["iterations", "{run}", "--source", "gpu0.power"]
# argv, the text the one stderr line must hold, and what it used to do
REPORTED = [
    (["record", "--simulate", "--duration", "nan", "-o", "{new}.h5"], "--duration", "traceback"),
    (["record", "--simulate", "--duration", "inf", "-o", "{new}.h5"], "--duration", "traceback"),
    (["record", "--simulate", "--duration", "1e308", "-o", "{new}.h5"], "--duration",
     "traceback"),
    (["record", "--simulate", "--seed", "-1", "--duration", "1", "-o", "{new}.h5"], "--seed",
     "traceback"),
    ([*CALIBRATE, "--grid-rate", "nan"], "--grid-rate", "traceback"),
    ([*CALIBRATE, "--grid-rate", "1e12"], "--grid-rate", "traceback"),
    ([*ITERATIONS, "--min-period", "nan"], "--min-period", "traceback"),
    (["keys", "k", "-d", "{text}"], "{text}", "traceback (FileExistsError)"),
    (["power-model", "{run}"], "{run}", "traceback (UnicodeDecodeError)"),
    (["energy", "{run}", "--calibration", "{run}"], "{run}", "traceback (UnicodeDecodeError)"),
    (["import", "nvml-npz", "{empty}", "-o", "{new}.h5"], "{empty}", "traceback (EOFError)"),
    (["import", "nvml-npz", "{npy}", "-o", "{new}.h5"], "{npy}", "traceback"),
    (["import", "nvml-npz", "{list_meta}", "-o", "{new}.h5"], "{list_meta}",
     "traceback (AttributeError)"),
    (["repair", "{foreign}"], "not a wattlab run file", "'closed cleanly; nothing to repair', 0"),
    (["repair", "{folder}"], "is a folder", "'no such file'"),
    (["import", "csv", "{folder}", "-o", "{new}.h5"], "is a folder", "'no such file'"),
    (["agent", "--key", "{folder}", "--server-key", "{text}"], "is a folder",
     "'readable by others'"),
    (["live", "{text}", "--wait", "2"], "not a run file", "'no run file appeared within 2 s'"),
    ([*ITERATIONS, "--rate", "-1"], "--rate", "ignored"),
    ([*ITERATIONS, "--rate", "nan"], "--rate", "ignored"),
    ([*ITERATIONS, "--from", "nan"], "--from", "ignored"),
    ([*CALIBRATE, "--min-phase", "nan"], "--min-phase", "ignored"),
    (["export", "{text}", "-o", "{new}.csv"], "{text}", "a header-only {new}.csv left"),
    (["demo", "--duration", "1e308", "-o", "{new}.h5"], "<= 3600", "ran"),
]


@pytest.mark.parametrize(("argv", "says", "used_to"), REPORTED,
                         ids=[" ".join(a[:4]) for a, _, _ in REPORTED])
def test_reported_bad_input_is_refused_in_one_line(argv, says, used_to, files, capsys):
    status = main([a.format(**files) for a in argv])
    err = capsys.readouterr().err
    assert status == 2, f"used to: {used_to}\n{err}"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert says.format(**files) in err, err
    assert not any(Path(p).name.startswith("new") for p in Path(files["new"]).parent.iterdir())
