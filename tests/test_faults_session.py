"""Whole sessions under fault: `wattlab record` processes, their children killed with -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import wattlab
from tests.conftest import Spawn

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc"),
]


def children(pid: int) -> dict[int, str]:
    """pid → command line of the direct children of ``pid``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found[int(entry.name)] = cmdline
    return found


def child_pid(session: subprocess.Popen[bytes], needle: str, timeout_s: float = 20.0) -> int:
    """Wait until the session has a child whose command line contains ``needle``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid, cmdline in children(session.pid).items():
            if needle in cmdline:
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no child process with {needle!r}")


def record(spawn: Spawn, path: Path, *extra: str, duration_s: float = 4.0
           ) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "wattlab.cli", "record", "--simulate", "--simulated-gpus", "2",
            "--duration", str(duration_s), "-o", str(path), *extra]
    return spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(session: subprocess.Popen[bytes]) -> tuple[int, str]:
    _, err = session.communicate(timeout=60)
    return session.returncode, err.decode()


def wait_for_rows(path: Path, source_id: str = "gpu1.power", timeout_s: float = 30.0) -> None:
    """Wait until the live run file holds rows of ``source_id`` (the workload is running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with wattlab.open(str(path)) as run:
                if source_id in run.sources and len(run.source(source_id)) > 0:
                    return
        except Exception:  # not created yet, or caught between two writes
            pass
        time.sleep(0.1)
    raise AssertionError(f"{path} never got rows of {source_id}")


def kill_after_data(session: subprocess.Popen[bytes], needle: str, path: Path) -> float:
    """SIGKILL the child named by ``needle`` a second into the workload; returns the time."""
    pid = child_pid(session, needle)
    wait_for_rows(path)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    return time.monotonic()


def test_killed_source_process_is_a_gap_and_the_others_go_on(tmp_path, spawn):
    path = tmp_path / "run.h5"
    session = record(spawn, path, "--source-processes")
    kill_after_data(session, '"name": "gpu0"', path)
    code, err = finish(session)
    assert code == 1, err  # a source failed: the session says so
    assert "gpu0" in err and "SIGKILL" in err
    with wattlab.open(str(path)) as run:
        lost = [g for g in run.gaps if g.source.startswith("gpu0")]
        assert lost and all("killed by SIGKILL" in g.reason for g in lost)
        assert not [g for g in run.gaps if g.source.startswith("gpu1")]
        gpu0 = run.source("gpu0.power").time_ns
        gpu1 = run.source("gpu1.power").time_ns
        assert gpu1[-1] - gpu0[-1] > 1.5e9  # gpu1 carried on to the end, gpu0 stopped
        [power] = [g for g in lost if g.source == "gpu0.power"]
        assert power.time_first_ns == gpu0[-1]  # from the last row on disk
        assert power.time_last_ns is not None and power.time_last_ns > gpu0[-1]


def back_after_restart(path: Path, timeout_s: float = 60.0) -> None:
    """Wait until gpu0.power has rows a second past its SIGKILL gap (the restart is done)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with wattlab.open(str(path)) as run:
                gaps = [g for g in run.gaps if g.source == "gpu0.power"]
                t = run.source("gpu0.power").time_ns
                if gaps and gaps[0].time_last_ns is not None and \
                        t[-1] > gaps[0].time_last_ns + 1e9:
                    return
        except Exception:  # caught between two writes
            pass
        time.sleep(0.1)
    raise AssertionError(f"{path}: gpu0.power never came back after its restart")


def test_restart_sources_brings_a_killed_source_back(tmp_path, spawn):
    """The session runs until the restarted source has sent data (a fixed 4 s session
    ended, under load, while the new process was still starting), then is stopped."""
    path = tmp_path / "run.h5"
    session = record(spawn, path, "--restart-sources", duration_s=120.0)
    kill_after_data(session, '"name": "gpu0"', path)
    back_after_restart(path)
    session.send_signal(signal.SIGTERM)
    code, err = finish(session)
    assert code == 130, err  # stopped by the signal, nothing lost but the kill's gap
    assert "restarting it" in err
    with wattlab.open(str(path)) as run:
        [gap] = [g for g in run.gaps if g.source == "gpu0.power"]
        assert "SIGKILL" in gap.reason
        t = run.source("gpu0.power").time_ns
        assert gap.time_last_ns is not None
        assert t[-1] > gap.time_last_ns + 1e9  # data again after the restart
        assert np.all(np.diff(t) > 0)


def test_killed_recorder_is_restarted_and_nothing_is_lost(tmp_path, spawn):
    path = tmp_path / "run.h5"
    session = record(spawn, path, "--source-processes", duration_s=4.0)
    kill_after_data(session, "wattlab.sync.recorder", path)
    code, err = finish(session)
    assert code == 0, err
    assert "restarting it" in err
    with wattlab.open(str(path)) as run:
        assert run.gaps == [], run.gaps
        assert "recorder restarted" in [m.name for m in run.markers]
        for gpu in ("gpu0", "gpu1"):
            t = run.source(f"{gpu}.power").time_ns
            assert np.all(np.diff(t) > 0)
            # the power stream is polled every 20 ms: no hole anywhere near the kill
            assert np.max(np.diff(t)) < 0.2e9, np.max(np.diff(t))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_a_process_session_cleanly(tmp_path, signum, spawn):
    path = tmp_path / "run.h5"
    session = record(spawn, path, "--source-processes", duration_s=30.0)
    wait_for_rows(path)
    time.sleep(1.0)
    if signum == signal.SIGINT:  # Ctrl-C reaches the whole process group
        for pid in [session.pid, *children(session.pid)]:
            os.kill(pid, signum)
    else:
        session.send_signal(signum)
    code, err = finish(session)
    assert code == 130, err
    with wattlab.open(str(path)) as run:
        assert run.gaps == [], run.gaps  # every source said "end"
        assert len(run.source("gpu1.power")) > 10


@pytest.mark.parametrize("stop", ["ends", "fails"])
def test_a_session_leaves_no_folder_behind(tmp_path: Path, monkeypatch, stop: str) -> None:
    """Each session's bus lives in a private temp folder: it goes when the session ends,
    also when the session fails (here: a command that cannot start)."""
    import tempfile

    from wattlab.cli import main

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    argv = ["record", "--simulate", "--duration", "0.3", "--no-live", "-o", str(tmp_path / "r.h5")]
    if stop == "fails":
        argv += ["--", str(tmp_path / "no-such-program")]
    code = main(argv)
    assert code == (0 if stop == "ends" else 2)
    assert list(scratch.iterdir()) == []
