"""A recorder that stalls or dies and is not restarted: the session repairs, says, exits 1.

Issue 36, items 1 and 11: a SIGSTOPped recorder was killed after 60 s of timeouts and the
session exited 0 with the normal summary, its file left open and no gap row; a recorder
that died unrestarted ended the session with 130 and "0 gaps". The stalls here are real
(SIGSTOP of the real recorder process) with the end's timeouts made short (--stop-timeout).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

import wattlab
from tests.conftest import Spawn
from tests.test_faults_session import child_pid, wait_for_rows
from wattlab.acquisition.session import Session, SessionResult
from wattlab.acquisition.session.salvage import Salvage, salvage
from wattlab.acquisition.session.source_process import SourceSpec
from wattlab.commands.record import exit_status
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import simulated_gpus
from wattlab.runfile.repair import writer_status

STOP_TIMEOUT_S = 2.0
COUNTS = re.compile(r"(gpu\d\.\w+) (\d+)/(\d+)")


def record(spawn: Spawn, path: Path, duration_s: float, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "wattlab.cli", "record", "--simulate", "--duration",
            str(duration_s), "--stop-timeout", str(STOP_TIMEOUT_S), "--no-live", "-o", str(path),
            *extra]
    return spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def kept_and_sent(err: str) -> dict[str, tuple[int, int]]:
    """stream → (rows kept, rows sent) from the session's one loss line."""
    [line] = [x for x in err.splitlines() if "rows kept/sent" in x]
    return {sid: (int(kept), int(sent)) for sid, kept, sent in COUNTS.findall(line)}


def check_repaired(path: Path, counts: dict[str, tuple[int, int]], reason: str) -> None:
    """Closed for every HDF5 tool; rows as the line says; a gap row for every row lost."""
    assert not writer_status(str(path)).open
    with h5py.File(path, "r"):  # plain h5py: refused while the file is left open
        pass
    with wattlab.open(str(path)) as run:
        assert set(counts) == set(run.sources)
        gaps = {g.source: g for g in run.gaps if reason in g.reason}
        for sid, (kept, sent) in counts.items():
            assert len(run.source(sid)) == kept
            if kept < sent:
                gap = gaps[sid]
                assert gap.samples_lost == sent - kept, (sid, gap)
                t = run.source(sid).time_ns
                if kept:  # from the last row kept to when the sources stopped
                    assert gap.time_first_ns == t[-1], (sid, gap)
                    assert gap.time_last_ns is not None and gap.time_last_ns > t[-1]


@pytest.mark.system
def test_a_stalled_recorder_is_killed_and_its_file_repaired_with_the_loss(
        tmp_path: Path, spawn: Spawn) -> None:
    path = tmp_path / "run.h5"
    session = record(spawn, path, 6.0)
    recorder = child_pid(session, "wattlab.sync.recorder")
    try:
        wait_for_rows(path, "gpu0.power")
        os.kill(recorder, signal.SIGSTOP)  # a stalled disk: alive, answers nothing
        stalled = time.monotonic()
        _, err_bytes = session.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(recorder, signal.SIGCONT)  # never leave a stopped process behind
    err = err_bytes.decode()
    assert session.returncode == 1, err
    # the end waits for the sources, the markers, the stop reply and the exit: 2 s each
    assert time.monotonic() - stalled < 6.0 + 6 * STOP_TIMEOUT_S, err
    assert "the recorder did not answer 'stop' within 2 s and was killed" in err
    counts = kept_and_sent(err)
    assert counts["gpu0.power"][0] < counts["gpu0.power"][1]  # the stall cost rows: said
    check_repaired(path, counts, "recorder did not answer 'stop'")


@pytest.mark.system
def test_a_dead_recorder_not_restarted_exits_1_with_its_file_repaired(
        tmp_path: Path, spawn: Spawn) -> None:
    path = tmp_path / "run.h5"
    session = record(spawn, path, 30.0, "--source-processes", "--no-restart-recorder")
    recorder = child_pid(session, "wattlab.sync.recorder")
    wait_for_rows(path, "gpu0.power")
    os.kill(recorder, signal.SIGKILL)
    _, err_bytes = session.communicate(timeout=60)
    err = err_bytes.decode()
    assert session.returncode == 1, err  # not 130: nobody pressed Ctrl-C
    assert "the recorder was killed by SIGKILL and was not restarted" in err
    counts = kept_and_sent(err)
    assert counts and all(sent >= kept for kept, sent in counts.values())
    check_repaired(path, counts, "recorder was killed by SIGKILL")
    with wattlab.open(str(path)) as run:
        assert len(run.gaps) >= len(counts) - 1  # a stream that ended needs none


@pytest.mark.system
@pytest.mark.parametrize("processes", [False, True])
def test_rows_sent_are_the_rows_of_a_clean_run(tmp_path: Path, processes: bool) -> None:
    """What the sources count is what a recorder that stopped cleanly wrote, stream by stream."""
    path = str(tmp_path / "run.h5")
    if processes:
        session = Session(path, [], source_specs=[SourceSpec("gpu0", "nvml", simulate=True)],
                          duration_s=1.5)
    else:
        from wattlab.acquisition.acquirers import NvmlAcquirer
        from wattlab.drivers.nvml import NvmlDriver

        driver = NvmlDriver(FakeNvml(simulated_gpus(1, 0)))
        driver.open()
        session = Session(path, [("gpu0", NvmlAcquirer(driver, 0))], duration_s=1.5)
    result = session.run()
    assert result.salvage is None and exit_status(result) == 0
    with wattlab.open(path) as run:
        assert result.rows_sent == {sid: len(run.source(sid)) for sid in run.sources}
    assert result.rows_sent["gpu0.power"] > 5


@pytest.mark.fast
def test_a_repair_that_cannot_run_prints_the_repair_command(tmp_path: Path) -> None:
    path = str(tmp_path / "gone.h5")
    done = salvage(path, "the recorder was killed by SIGKILL and was not restarted",
                   {"gpu0.power": 12}, time.monotonic_ns())
    assert done.error is not None
    assert done.line().endswith(f"run `wattlab repair {path}`")
    assert "gpu0.power 12" in done.line()


@pytest.mark.fast
def test_a_lost_recorder_is_exit_status_1_whatever_else_happened() -> None:
    lost = Salvage("r.h5", "the recorder was killed by SIGKILL and was not restarted",
                   {"gpu0.power": 10}, {"gpu0.power": 7}, 1)
    assert lost.rows_lost == 3 and "gpu0.power 7/10" in lost.line()
    for interrupted in (False, True):
        result = SessionResult("r.h5", None, {}, {}, interrupted, salvage=lost)
        assert exit_status(result) == 1


@pytest.mark.fast
@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "1e9"])
def test_stop_timeout_is_checked(tmp_path: Path, value: str, capsys) -> None:
    from wattlab.cli import main

    code = main(["record", "--simulate", "--duration", "1", "--stop-timeout", value,
                 "-o", str(tmp_path / "r.h5")])
    assert code == 2
    assert "--stop-timeout must be in (0, 3600] s" in capsys.readouterr().err
    assert not (tmp_path / "r.h5").exists()
