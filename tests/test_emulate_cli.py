"""`wattlab emulate KIND` ends as every command does (docs/cli.md): 130 after Ctrl-C or
SIGTERM, once it has stopped cleanly, and nothing of it is left on disk."""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import emulator_cli

STOP_TIMEOUT_S = 20.0
EMULATE = [sys.executable, "-m", "wattlab.cli", "emulate"]


@pytest.mark.system
@pytest.mark.parametrize(("kind", "signum"), [
    ("pmd", signal.SIGINT), ("pmd", signal.SIGTERM), ("wt310e", signal.SIGTERM)])
def test_emulate_exits_130_after_a_clean_stop(kind: str, signum: int) -> None:
    with emulator_cli([*EMULATE, kind]) as (proc, line):
        assert line.strip(), f"emulate {kind} printed nothing"
        proc.send_signal(signum)
        assert proc.wait(STOP_TIMEOUT_S) == 130
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read()


@pytest.mark.system
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_emulate_rapl_removes_its_tree_however_it_stops(signum: int) -> None:
    with emulator_cli([*EMULATE, "rapl"]) as (proc, line):
        root = Path(line.split(": ", 1)[1].split()[0])
        assert (root / "intel-rapl:0" / "energy_uj").is_file()
        proc.send_signal(signum)
        assert proc.wait(STOP_TIMEOUT_S) == 130
    assert not root.exists()
    assert root.parent == Path(tempfile.gettempdir()) or not root.parent.exists()
