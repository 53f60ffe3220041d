"""Corrupt, truncated and foreign files, and bad arguments: exit status 2, one clear line.

Analysis commands run in-process through ``wattlab.cli.main``: a traceback would be an
exception escaping ``main`` and fail the test. No partial output file may be left.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from wattlab.cli import main
from wattlab.errors import RunFileError
from wattlab.runfile.layout_check import check_run_file
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Marker, SourceDescriptor


def good_run(path: Path) -> None:
    """A small synthetic run: a reference meter and an NVML-like stream, 10 s at 100 Hz."""
    writer = RunFileWriter(str(path), {"command": "[]"}, 0)
    for sid in ("ref", "gpu0.power"):
        writer.add_source(SourceDescriptor(sid, "test", "Synthetic", (Channel("power_w", "W"),)))
        t = np.arange(1000, dtype=np.int64) * 10_000_000
        power = 100 + 50 * (np.arange(1000) // 200 % 2)
        writer.append(sid, t, t, power.astype(np.float64)[:, None], np.zeros(1000, np.uint8))
    writer.add_markers([Marker(2_000_000_000, "phase", "begin", "workload"),
                        Marker(4_000_000_000, "phase", "end", "workload")])
    writer.close(fit_device_clocks=False)


def _edit(src: Path, dst: Path, change: Callable[[h5py.File], None]) -> None:
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        change(f)


def _replace(f: h5py.File, name: str, data: np.ndarray) -> None:
    del f[name]
    f[name] = data


def _as_group(f: h5py.File, name: str) -> None:
    del f[name]
    f.create_group(name)


BAD_FILES: dict[str, Callable[[Path, Path], None]] = {
    "empty": lambda good, p: p.write_bytes(b""),
    "random": lambda good, p: p.write_bytes(np.random.default_rng(1).bytes(8192)),
    "truncated": lambda good, p: p.write_bytes(good.read_bytes()[: good.stat().st_size // 2]),
    "other_layout": lambda good, p: h5py.File(p, "w").close(),
    "no_values": lambda good, p: _edit(good, p, lambda f: f.__delitem__("sources/ref/values")),
    "no_time": lambda good, p: _edit(good, p, lambda f: f.__delitem__("sources/ref/time")),
    "flags_group": lambda good, p: _edit(good, p, lambda f: _as_group(f, "sources/ref/flags")),
    "text_time": lambda good, p: _edit(good, p, lambda f: _replace(
        f, "sources/ref/time", np.array([b"x"] * 3))),
    "no_gaps": lambda good, p: _edit(good, p, lambda f: f.__delitem__("gaps")),
    "bad_descriptor": lambda good, p: _edit(good, p, lambda f: f["sources/ref"].attrs.__setitem__(
        "descriptor_json", "{nope")),
    "bad_payload": lambda good, p: _edit(good, p, lambda f: f["markers"].__setitem__(
        (0, "payload"), b"{nope")),
}
VERBS = {
    "info": [],
    "energy": [],
    "calibrate": ["--reference", "ref", "--target", "gpu0.power", "-o", "{out}/cal.json"],
    "iterations": ["--source", "ref"],
    "report": ["-o", "{out}/report.html"],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    good = folder / "good.h5"
    good_run(good)
    made = {"good": good}
    for name, make in BAD_FILES.items():
        made[name] = folder / f"{name}.h5"
        make(good, made[name])
    return made


@pytest.mark.fast
@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_check_run_file_names_the_problem(files: dict[str, Path], name: str) -> None:
    with pytest.raises(RunFileError) as info:
        check_run_file(str(files[name]))
    assert str(files[name]) in str(info.value)


@pytest.mark.fast
@pytest.mark.parametrize(("name", "problem"), [
    ("no_values", "/sources/ref has no 'values' dataset"),
    ("flags_group", "/sources/ref/flags is not a dataset"),
    ("text_time", "/sources/ref/time has dtype |S1 and 1 dimension(s)"),
    ("bad_descriptor", "/sources/ref: descriptor or channel names unreadable")])
def test_the_layout_check_says_what_is_wrong(files: dict[str, Path], name: str,
                                             problem: str) -> None:
    # datasets are opened by HDF5's own call; where that fails, h5py's lookup says why
    with pytest.raises(RunFileError) as info:
        check_run_file(str(files[name]))
    assert problem in str(info.value)


@pytest.mark.fast
def test_a_good_run_passes_the_checks(files: dict[str, Path]) -> None:
    check_run_file(str(files["good"]))
    assert main(["info", str(files["good"])]) == 0


@pytest.mark.fast
@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_analysis_commands_refuse_bad_files(files: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str], name: str,
                                            verb: str) -> None:
    before = hashlib.sha256(files[name].read_bytes()).hexdigest()
    args = [a.format(out=tmp_path) for a in VERBS[verb]]
    assert main([verb, str(files[name]), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wattlab: error: ") and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == []  # no partial output
    assert hashlib.sha256(files[name].read_bytes()).hexdigest() == before  # not modified


@pytest.mark.fast
@pytest.mark.parametrize("argv", [
    ["record", "--simulate", "--duration", "-1", "-o", "x.h5"],
    ["record", "--simulate", "--duration", "1", "--max-restarts", "-1", "-o", "x.h5"],
    ["record", "--simulate", "--duration", "1", "--replay-buffer-mb", "0", "-o", "x.h5"],
    ["record", "--simulate", "--duration", "1", "--backlog-mb", "nan", "-o", "x.h5"],
    ["record", "--simulate", "--duration", "1", "--meter", "bogus:/dev/null", "-o", "x.h5"],
    ["record", "--simulate", "--duration", "1", "--meter", "ps3", "-o", "x.h5"],
    ["record", "--source-processes", "--nvml", "none", "--duration", "1", "-o", "x.h5"],
    ["record", "--simulate", "--duration", "1", "--listen", "-o", "x.h5"],
    ["record", "-o", "x.h5", "--duration"],
    ["info"],
    ["no-such-verb"],
    ["info", "/no/such/file.h5"],
])
def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("wattlab: error: ") and "Traceback" not in err
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.fast
def test_an_existing_run_file_is_never_overwritten(files: dict[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "run.h5"
    shutil.copy(files["good"], target)
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    for extra in ([], ["--source-processes"]):
        argv = ["record", "--simulate", "--duration", "1", "-o", str(target), *extra]
        assert main(argv) == 2
        assert "never overwrites" in capsys.readouterr().err
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before


@pytest.mark.system
def test_every_reader_opens_the_same_way_while_a_run_is_open(files: dict[str, Path],
                                                             tmp_path: Path) -> None:
    """HDF5 refuses a second handle whose locking flag differs; the report once hit that."""
    import wattlab
    from wattlab.analysis.report.html_report import build_report
    from wattlab.runfile.calibration_record import read_calibrations

    with wattlab.open(str(files["good"])) as run:
        assert read_calibrations(str(files["good"])) == []
        check_run_file(str(files["good"]))
        build_report(str(files["good"]), str(tmp_path / "r.html"))
        assert len(run.source("ref")) == 1000
