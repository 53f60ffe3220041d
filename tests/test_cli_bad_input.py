"""The whole bad-input matrix through ``wattlab.cli.main``, in-process: no traceback, ever.

Built from the argparse parser itself, so a new verb or option is covered the day it is
added: every numeric option (typed with ``wattlab.arg_types.Number``) × nan, inf, -1 and
1e308, and every path argument × a missing path, a folder, a text file, an empty file, a
foreign HDF5 file and a truncated run file. Each must end with exit status 2, one line on
stderr naming the option or file, and no output file left behind (issue 36, item 9 and 12).
"""

from __future__ import annotations

import argparse
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import h5py
import pytest

from tests.data_files import H100_CAPTURE, ULISBOA, data_file
from wattlab.arg_types import Folder, InputFile, Number, OutputFile
from wattlab.cli import build_parser, main

pytestmark = pytest.mark.fast

BAD_NUMBERS = ("nan", "inf", "-1", "1e308")

# Values an option accepts on purpose, with the reason (the matrix skips these pairs).
ACCEPTED = {
    ("iterations", "--from", "-1"): "seconds since the session start: rows before it exist",
    ("iterations", "--to", "-1"): "seconds since the session start: rows before it exist",
}

# Options whose values are not one number; each names why and where it is checked instead.
NOT_NUMBERS = {
    ("energy", "--window"): "T0:T1, two numbers: energy.window_s refuses non-finite ones",
    ("energy", "--per"): "a unit's name (arg_types.non_empty_name): test_serving_energy.py",
    ("energy", "--charge"): "part names (energy.charge_parts): test_process_energy.py",
    ("demo", "--mig"): "MIG profile names (demo.mig_profiles): test_mig.py",
    ("qualify", "--levels"): "level names (qualify.level_list): test_qualify_gpu_counter.py",
}
# Numbers typed int or float whose range the command checks with its own message (the matrix
# still runs them, after this argv: exit 2 and one line naming the option).
RECORD = ["record", "--simulate", "--duration", "1", "-o", "never.h5"]
CHECKED_BY_THE_COMMAND = {
    ("record", "--stop-timeout"): RECORD,  # '(0, 3600] s' (tests/test_faults_stall.py)
    ("record", "--simulated-gpus"): RECORD,  # '1 to 16' (tests/test_record_limits.py)
}


def _parsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (verb words, parser) that takes options, sub-verbs (``bench check``) included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _parsers(child, (*prefix, name))


PARSERS = dict(_parsers(build_parser()))


def _option(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def _numeric_cases() -> Iterator[tuple[tuple[str, ...], str, str]]:
    for words, parser in PARSERS.items():
        for action in parser._actions:
            checked = (" ".join(words), _option(action)) in CHECKED_BY_THE_COMMAND
            if isinstance(action.type, Number) or checked:
                for value in BAD_NUMBERS:
                    if (words[-1], _option(action), value) not in ACCEPTED:
                        yield words, _option(action), value


def test_every_numeric_option_has_a_checked_type():
    # a bare type=float lets nan, inf and 1e308 through; a new option must take a Number
    bare = [(" ".join(w), _option(a)) for w, p in PARSERS.items() for a in p._actions
            if a.type is not None and not isinstance(a.type, (Number, *PATH_TYPES))
            and (" ".join(w), _option(a)) not in {**NOT_NUMBERS, **CHECKED_BY_THE_COMMAND}]
    assert bare == []


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(argv)
    return status, capsys.readouterr().err


def _refused(status: int, err: str, names: str, expected: int = 2) -> None:
    lines = err.strip().splitlines()
    assert status == expected, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert names in lines[0], err


@pytest.mark.parametrize(("words", "option", "value"), list(_numeric_cases()),
                         ids=lambda x: " ".join(x) if isinstance(x, tuple) else x)
def test_numeric_option_refuses(words, option, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = CHECKED_BY_THE_COMMAND.get((" ".join(words), option), list(words))
    status, err = _run([*before, option, value], capsys)
    _refused(status, err, option)
    number = next(a.type for a in PARSERS[words]._actions if _option(a) == option)
    if isinstance(number, Number) and (float(value) > number.high or value == "nan"):
        assert number.rule() in err  # the stated maximum
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["-1", "0"])
def test_a_bad_number_is_refused_before_the_command_after_dashes_starts(value, capsys):
    status, err = _run(["record", "--duration", value, "--", "true"], capsys)
    _refused(status, err, "--duration")


# ---- path arguments ----------------------------------------------------------------------

KINDS = ("missing", "folder", "text", "empty", "foreign_hdf5", "truncated_run")
PATH_TYPES = (InputFile, OutputFile, Folder)

# Path arguments without a path type, each with the reason; the matrix still runs them.
UNTYPED_PATHS = {
    ("energy", "runs"): "run files or folders of them (many_runs.expand_runs)",
    ("export", "runs"): "run files or folders of them (many_runs.expand_runs)",
    ("info", "runs"): "run files or folders of them (many_runs.expand_runs)",
    ("fit", "sweep"): "a sweep file or a folder of published tables",
    ("live", "run"): "may not exist yet: the panel waits for it (--wait)",
    ("record", "--output"): "--per-node ranks parse it beside the rank that creates it",
    ("slurm", "--output"): "every task of the allocation parses it; task 0 creates it",
    ("devices", "--probe"): "a serial port (a device node, not a regular file)",
}
# Arguments whose help mentions a file but that name none.
NOT_PATHS = {("import", "--source"): "the name of the source each file becomes",
             ("record", "--stop-timeout"): "seconds; its help mentions the run file"}
# Path arguments the matrix leaves out, with the reason.
NOT_IN_MATRIX = {
    ("slurm", "--output"): "refused outside a Slurm allocation before the file is looked at "
                           "(tests/test_slurm.py)",
    ("layers", "--output"): "needs PyTorch to build the model first (tests/test_layers.py)",
    ("layers", "--store"): "needs PyTorch to build the model first (tests/test_layers.py)",
    ("layers", "--keep-captures"): "real GPU only",
    ("devices", "--probe"): "a serial port: reported, per port, in the listing",
}
# Kinds of path an argument accepts on purpose, beyond what its type says (an output may be
# missing; a folder to write into may exist; a report is rewritten).
ACCEPTED_KINDS = {
    ("live", "run"): {"missing", "empty"},  # waited for: a recorder may be creating it
    ("record", "--output"): {"missing"},
    ("record", "--allow-keys"): {"folder"},  # an empty folder: no agent may connect
}
# Refused, with another status than 2, and why.
OTHER_STATUS = {
    ("record", "--rapl", "folder"): (1, "a powercap folder without zones is a machine "
                                        "without RAPL: a device failure"),
}


def _accepted_kinds(argument: tuple[str, str]) -> set[str]:
    kinds = set(ACCEPTED_KINDS.get(argument, ()))
    action = next(a for a in PARSERS[tuple(argument[0].split())]._actions
                  if _option(a) == argument[1])
    if isinstance(action.type, OutputFile | Folder) and not getattr(action.type, "must_exist",
                                                                       False):
        kinds.add("missing")
    if isinstance(action.type, Folder):
        kinds.add("folder")
    if isinstance(action.type, OutputFile) and action.type.overwrite:
        kinds |= {"text", "empty", "foreign_hdf5", "truncated_run"}
    return kinds
FOLDER_WORDS = ("folder", "directory")


def _path_arguments() -> set[tuple[str, str]]:
    """Every (verb, argument) that names a file or folder, found in the parser."""
    found = set()
    for words, parser in PARSERS.items():
        for action in parser._actions:
            key = (" ".join(words), _option(action))
            if isinstance(action.type, PATH_TYPES) or key in UNTYPED_PATHS:
                found.add(key)
    return found


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Good inputs beside the bad one (keys, a run file), built once and only read."""
    from wattlab.sync.bus import create_keypair

    folder = tmp_path_factory.mktemp("good")
    create_keypair(str(folder / "keys"), "good")
    shutil.copy(data_file("demo/demo24.h5"), folder / "good.h5")
    (folder / "requests.jsonl").write_text(
        '{"id": "r1", "start_unix_s": 1795825141.0, "first_token_unix_s": 1795825141.2, '
        '"end_unix_s": 1795825142.0, "prompt_tokens": 5, "output_tokens": 9}\n')
    return folder


def _base_argv(good: Path, tmp_path: Path) -> dict[tuple[str, str], list[str]]:
    """(verb, argument) -> an argv whose only bad part is BAD."""
    public, secret = str(good / "keys/good.key"), str(good / "keys/good.key_secret")
    run = str(good / "good.h5")
    gpm = ULISBOA / "v2.0_TPDS2019/example_files"
    training, model = str(gpm / "micro_gtxtitanx.csv"), str(gpm / "model_gtxtitanx.csv")
    new = str(tmp_path / "new")
    return {
        ("agent", "--key"): ["agent", "--key", "BAD", "--server-key", public],
        ("agent", "--server-key"): ["agent", "--key", secret, "--server-key", "BAD"],
        ("bench check", "bench"): ["bench", "check", "BAD"],
        ("bench init", "--output"): ["bench", "init", "-o", "BAD"],
        ("calibrate", "run"): ["calibrate", "BAD", "--reference", "ps3", "--target",
                               "gpu0.power", "-o", new + ".json"],
        ("calibrate", "--output"): ["calibrate", run, "--reference", "ps3", "--target",
                                    "gpu0.power", "-o", "BAD"],
        ("demo", "--output"): ["demo", "-o", "BAD", "--duration", "1"],
        ("energy", "runs"): ["energy", "BAD"],
        ("energy", "--calibration"): ["energy", run, "--calibration", "BAD"],
        ("excite", "--output"): ["excite", "--simulate", "--duration", "1", "-o", "BAD"],
        ("export", "runs"): ["export", "BAD", "-o", new + ".csv"],
        ("export", "--output"): ["export", run, "--format", "csv", "-o", "BAD"],
        ("fit", "sweep"): ["fit", "BAD"],
        ("import", "files"): ["import", "nvml-npz", "BAD", "-o", new + ".h5"],
        ("import", "--output"): ["import", "nvml-npz", str(H100_CAPTURE), "-o", "BAD"],
        ("import", "--into"): ["import", "requests", str(good / "requests.jsonl"), "--into",
                               "BAD"],
        ("info", "runs"): ["info", "BAD"],
        ("iterations", "run"): ["iterations", "BAD", "--source", "gpu0.power"],
        ("nvml-agreement", "run"): ["nvml-agreement", "BAD"],
        ("keys", "--dir"): ["keys", "good2", "-d", "BAD"],
        ("live", "run"): ["live", "BAD", "--wait", "0"],
        ("log", "run"): ["log", "BAD", "--dry-run"],
        ("log", "--dir"): ["log", "BAD", "--to", "tensorboard", "--dir", "BAD"],
        ("power-model", "training"): ["power-model", "BAD"],
        ("power-model", "--published"): ["power-model", training, "--published", "BAD"],
        ("power-model", "--apps"): ["power-model", training, "--published", model,
                                    "--apps", "BAD"],
        ("qualify", "run"): ["qualify", "BAD", "--reference", "ps3", "--target", "gpu0.power",
                             "--accuracy-class", "0.5 %"],
        ("qualify", "--calibration"): ["qualify", run, "--reference", "ps3", "--target",
                                       "gpu0.power", "--accuracy-class", "0.5 %",
                                       "--calibration", "BAD"],
        ("qualify", "--bench"): ["qualify", "--gpu", "0", "--bench", "BAD", "--reference",
                                 "ps3", "--target", "gpu0.power", "--accuracy-class", "0.5 %",
                                 "-o", new + ".h5"],
        ("qualify", "--output"): ["qualify", "--simulate", "--short", "-o", "BAD"],
        ("record", "--bench"): ["record", "--bench", "BAD", "-o", new + ".h5",
                                "--duration", "1"],
        ("record", "--output"): ["record", "--simulate", "--duration", "1", "-o", "BAD"],
        ("record", "--rapl"): ["record", "--nvml", "none", "--rapl", "BAD", "--duration", "1",
                               "-o", new + ".h5"],
        ("record", "--server-key"): ["record", "--listen", "tcp://127.0.0.1:0", "--server-key",
                                     "BAD", "--allow-keys", str(good / "keys"),
                                     "--duration", "1", "-o", new + ".h5"],
        ("record", "--allow-keys"): ["record", "--listen", "tcp://127.0.0.1:0",
                                     "--server-key", secret, "--allow-keys", "BAD",
                                     "--duration", "1", "-o", new + ".h5"],
        ("repair", "run"): ["repair", "BAD"],
        ("report", "run"): ["report", "BAD", "-o", new + ".html"],
        ("report", "--output"): ["report", run, "-o", "BAD"],
        ("sweep", "--output"): ["sweep", "--power-limits", "300", "--simulate", "--dry-run",
                                "-o", "BAD"],
        ("tune", "--output"): ["tune", "--simulate", "--duration", "1", "--dry-run", "-o",
                               "BAD"],
    }


def test_every_path_argument_is_in_the_matrix(good, tmp_path):
    listed = set(_base_argv(good, tmp_path)) | set(NOT_IN_MATRIX)
    assert _path_arguments() - listed == set()  # a new path argument: add its argv above
    assert listed - _path_arguments() == set()  # a listed one that no longer exists


def test_every_path_like_argument_has_a_path_type():
    # an argument whose name or help says file or folder but takes any string: either give
    # it a path type (wattlab.arg_types) or list it in UNTYPED_PATHS with the reason
    pathlike = re.compile(r"\b(file|folder|PATH|DIR)\b|\.(h5|key|toml|json|csv)\b")
    untyped = [(" ".join(w), _option(a)) for w, p in PARSERS.items() for a in p._actions
               if a.nargs != 0 and not isinstance(a.type, (*PATH_TYPES, Number))
               and pathlike.search(f"{a.metavar or ''} {a.help or ''}")
               and (" ".join(w), _option(a)) not in {**UNTYPED_PATHS, **NOT_PATHS}]
    assert untyped == []


@pytest.fixture
def bad_path(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    kind = request.param
    path = tmp_path / f"bad-{kind}.h5"
    if kind == "folder":
        path.mkdir()
    elif kind == "text":
        path.write_text("time,power\nthis is not a number\n")
    elif kind == "empty":
        path.touch()
    elif kind == "foreign_hdf5":
        with h5py.File(path, "w") as f:
            f["data"] = [1.0, 2.0, 3.0]
    elif kind == "truncated_run":
        whole = data_file("demo/demo24.h5").read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    return path


def _snapshot(path: Path) -> object:
    if path.is_dir():
        return sorted(p.name for p in path.iterdir())
    return path.read_bytes() if path.exists() else None


@pytest.mark.parametrize("bad_path", KINDS, indirect=True)
@pytest.mark.parametrize("argument", sorted(_path_arguments() - set(NOT_IN_MATRIX)),
                         ids=" ".join)
def test_path_argument_refuses(argument, bad_path, good, tmp_path, capsys):
    kind = bad_path.name.removeprefix("bad-").removesuffix(".h5")
    if kind in _accepted_kinds(argument):
        pytest.skip(f"{argument} accepts a {kind} path on purpose")
    before = _snapshot(bad_path)
    argv = [str(bad_path) if a == "BAD" else a for a in _base_argv(good, tmp_path)[argument]]
    status, err = _run(argv, capsys)
    _refused(status, err, bad_path.name, OTHER_STATUS.get((*argument, kind), (2,))[0])
    if kind == "folder":
        assert any(word in err for word in FOLDER_WORDS), err
    elif kind != "missing":
        assert "no such" not in err and "appeared" not in err, err  # it is there
    assert _snapshot(bad_path) == before  # a refused input or output is left as it was
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("new")]
    assert left == []  # no output file left behind


# ---- numbers inside text options ---------------------------------------------------------

NUMBERS_IN_TEXT = [
    (["record", "--simulate", "--nvml-intervals", "power=1e308", "--duration", "1"],
     "power=1e308"),  # was an OverflowError traceback
    (["record", "--simulate", "--nvml-intervals", "energy=inf", "--duration", "1"],
     "energy=inf"),
    (["sweep", "--simulate", "--dry-run", "--sm-clocks", "100:inf:10"], "100:inf:10"),  # was
    (["sweep", "--simulate", "--dry-run", "--sm-clocks", "100:1e9:1e-3"], "more than 1000"),
    (["sweep", "--simulate", "--dry-run", "--power-limits", "nan"], "'nan'"),
]


@pytest.mark.parametrize(("argv", "names"), NUMBERS_IN_TEXT, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_numbers_inside_text_options_are_refused(argv, names, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status, err = _run(argv, capsys)
    _refused(status, err, names)
    assert list(tmp_path.iterdir()) == []



# ---- URL arguments -----------------------------------------------------------------------

# Every argument whose metavar names a URL, with an argv whose only bad part is BAD; URLs
# refused before anything connects are tried here, the ones refused by what answers there
# (nobody, a 404, a page that is not Prometheus's) in tests/test_scrape.py.
URL_ARGUMENTS = {("record", "--scrape"): ["record", "--nvml", "none", "--duration", "1",
                                          "-o", "never.h5", "--scrape", "BAD"]}
BAD_URLS = {
    "not http": "ftp://127.0.0.1/metrics",
    "no scheme": "127.0.0.1:8000/metrics",
    "no host": "http:///metrics",
    "port out of range": "http://127.0.0.1:70000/metrics",
}


def test_every_url_argument_is_in_the_matrix():
    found = {(" ".join(w), _option(a)) for w, p in PARSERS.items() for a in p._actions
             if "URL" in str(a.metavar or "")}
    assert found == set(URL_ARGUMENTS)


@pytest.mark.parametrize("url", BAD_URLS.values(), ids=list(BAD_URLS))
@pytest.mark.parametrize("argument", sorted(URL_ARGUMENTS), ids=" ".join)
def test_url_argument_refuses(argument, url, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [url if a == "BAD" else a for a in URL_ARGUMENTS[argument]]
    status, err = _run(argv, capsys)
    _refused(status, err, argument[1])
    assert url in err
    assert list(tmp_path.iterdir()) == []
