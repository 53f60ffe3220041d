"""The security review as tests: nothing from the bus or a file is ever executed or unpickled,
local endpoints are private, the remote bus is loopback and keyed unless told otherwise.
"""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from wattlab.commands.record import DEFAULT_LISTEN
from wattlab.errors import UsageError
from wattlab.sync.bus.publisher import local_endpoint
from wattlab.sync.recorder.process import Recorder, RecorderConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "wattlab"
UNSAFE_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle", "joblib"}
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__", "input"}


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "_site" not in p.parts)


def _findings(path: Path, root: Path) -> list[str]:
    """Imports of unpickling modules, eval/exec-like calls, allow_pickle/shell=True."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where} imports {a.name}" for a in node.names
                      if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in \
                UNSAFE_MODULES:
            found.append(f"{where} imports from {node.module}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in UNSAFE_CALLS:
                found.append(f"{where} calls {func.id}()")
            for kw in node.keywords:
                value = kw.value
                if (kw.arg in ("allow_pickle", "shell") and isinstance(value, ast.Constant)
                        and value.value is True):
                    found.append(f"{where} passes {kw.arg}=True")
            if (isinstance(func, ast.Attribute) and func.attr == "load"
                    and isinstance(func.value, ast.Name) and func.value.id == "yaml"):
                found.append(f"{where} calls yaml.load (use safe_load)")
    return found


@pytest.mark.fast
def test_the_scan_sees_what_it_looks_for(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import pickle\nfrom marshal import loads\neval('1')\n"
                     "np.load(f, allow_pickle=True)\nsubprocess.run(c, shell=True)\n")
    assert len(_findings(probe, tmp_path)) == 5
    assert _code_only(probe).count("pickle") == 2


@pytest.mark.system
def test_no_pickle_eval_or_exec_anywhere_in_the_package() -> None:
    files = _sources()
    assert len(files) > 30
    findings = [f for p in files for f in _findings(p, SRC)]
    assert findings == []


def _code_only(path: Path) -> str:
    """The file with comments and string literals (docstrings included) blanked out."""
    out: list[str] = []
    with path.open() as f:
        for token in tokenize.generate_tokens(f.readline):
            if token.type not in (tokenize.COMMENT, tokenize.STRING):
                out.append(token.string)
    return " ".join(out)


@pytest.mark.system
def test_the_words_pickle_eval_exec_appear_only_in_prose() -> None:
    """A plain grep, as the review asked, over code (comments and strings may explain)."""
    for path in _sources():
        code = _code_only(path).replace("allow_pickle = False", "")
        for word in ("pickle", "eval (", "exec (", "marshal"):
            assert word not in code, f"{path.relative_to(SRC)}: {word!r} in code"


@pytest.mark.fast
def test_local_bus_endpoints_are_private() -> None:
    endpoint = local_endpoint()
    assert endpoint.startswith("ipc://")
    folder = Path(endpoint.removeprefix("ipc://")).parent
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # other users cannot connect
    finally:
        folder.rmdir()


@pytest.mark.system
def test_local_endpoint_folders_are_removed_by_the_exit_at_the_latest() -> None:
    """A process that asks for endpoints and forgets them leaves no folder in /tmp."""
    code = ("from wattlab.sync.bus.publisher import local_endpoint, private_endpoint\n"
            "import os\n"
            "print(local_endpoint().removeprefix('ipc://'))\n"
            "with private_endpoint() as e:\n"
            "    print(e.removeprefix('ipc://'))\n"
            "print(os.path.isdir(os.path.dirname(e.removeprefix('ipc://'))))\n"
            "f = local_endpoint().removeprefix('ipc://')\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    raise SystemExit(0)  # a forked child's exit leaves its parent's folders\n"
            "os.waitpid(child, 0)\n"
            "print(os.path.isdir(os.path.dirname(f)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    forgotten, scoped, scoped_left, after_fork = done.stdout.split()
    assert scoped_left == "False"  # private_endpoint removes its folder at once
    assert after_fork == "True"
    assert forgotten != scoped
    assert not Path(forgotten).parent.exists() and not Path(scoped).parent.exists()


@pytest.mark.system
def test_remote_bus_defaults_to_loopback_and_needs_keys(tmp_path: Path) -> None:
    assert DEFAULT_LISTEN.startswith("tcp://127.0.0.1:")
    with pytest.raises(UsageError, match="secret key"):
        Recorder(RecorderConfig(endpoint=local_endpoint(), output=str(tmp_path / "r.h5"),
                                session_start_ns=0, listen="tcp://127.0.0.1:0"))
    assert not (tmp_path / "r.h5").exists()


@pytest.mark.fast
def test_run_files_are_created_exclusively(tmp_path: Path) -> None:
    """O_EXCL semantics all the way down: h5py mode 'x', never 'w'."""
    for path in _sources():
        text = path.read_text()
        assert 'h5py.File(path, "w"' not in text and "mode=\"w\"" not in text, path
    target = tmp_path / "taken.h5"
    target.write_bytes(b"precious")
    from wattlab.runfile.writer import RunFileWriter

    with pytest.raises(UsageError, match="never overwrites"):
        RunFileWriter(str(target), {}, 0)
    assert target.read_bytes() == b"precious"
    os.chmod(target, 0o600)
