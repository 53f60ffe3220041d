"""Rows kept against rows sent under faults: every row not kept is in a gap row, no 0 exit.

Issue 36's invariant, checked on a CI-sized subset of `bench/faults.py --only rows`
(docs/reliability.md, "Rows kept against rows sent"): a session with one simulated GPU,
the fault injected into the real recorder or source process; per stream rows kept plus
the rows the gap rows account for equal the rows sent, and `record` exits non-zero
whenever a row was lost. The session runs a workload that ends when the test says so, so
its own end (and exit status) is the normal one, not an interrupt.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wattlab
from tests.test_faults_session import children, wait_for_rows
from wattlab.acquisition.acquirers import NvmlAcquirer
from wattlab.acquisition.session import Session, SessionResult
from wattlab.acquisition.session.source_process import SourceSpec
from wattlab.commands.record import exit_status
from wattlab.drivers.nvml import NvmlDriver
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import simulated_gpus

TINY_QUEUE_BYTES = 2048  # replay window and backlog: a few batches of a simulated GPU
ROWS_WHILE_AWAY = 600  # rows produced while the recorder is stopped: far beyond 2 x 2 KiB
WAIT_S = 60.0  # a bound for what must happen, not a tuned delay


class CountingAcquirer:
    """A simulated GPU that counts the rows it produced (the test waits on that count)."""

    def __init__(self) -> None:
        driver = NvmlDriver(FakeNvml(simulated_gpus(1, 0)))
        driver.open()
        self._inner = NvmlAcquirer(driver, 0)
        self.rows = 0

    def poll(self) -> list[Any]:
        readings: list[Any] = self._inner.poll()
        self.rows += sum(len(r.t_host_ns) for r in readings if hasattr(r, "t_host_ns"))
        return readings

    def __getattr__(self, name: str) -> Any:  # open, close, flush, wake
        return getattr(self._inner, name)


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def recorder_pid() -> int:
    found: list[int] = []
    wait_until(lambda: found.extend(pid for pid, cmd in children(os.getpid()).items()
                                    if "wattlab.sync.recorder" in cmd) or found, "the recorder")
    return found[0]


@contextlib.contextmanager
def running(session: Session) -> Iterator[dict[str, SessionResult]]:
    """``session.run()`` in a thread; the result lands in the box once it has ended."""
    box: dict[str, SessionResult] = {}
    thread = threading.Thread(target=lambda: box.update(result=session.run()))
    thread.start()
    try:
        yield box
    finally:
        thread.join(WAIT_S * 3)
        assert not thread.is_alive(), "the session did not end"


def workload(flag: Path) -> list[str]:
    """A command that ends when ``flag`` exists: the session's end, chosen by the test."""
    return [sys.executable, "-c", "import os, sys, time\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.05)", str(flag)]


def check_rows_accounted(result: SessionResult) -> int:
    """Per stream kept + the rows in its gap rows = sent; returns the rows lost."""
    with wattlab.open(result.output) as run:
        kept = {sid: len(run.source(sid)) for sid in run.sources}
        in_gaps: dict[str, int] = {}
        for gap in run.gaps:
            assert gap.samples_lost >= 0, gap  # every count is known here
            in_gaps[gap.source] = in_gaps.get(gap.source, 0) + gap.samples_lost
    assert set(result.rows_sent) == set(kept)
    for sid, sent in result.rows_sent.items():
        assert kept[sid] + in_gaps.get(sid, 0) == sent, (sid, kept[sid], in_gaps.get(sid), sent)
    return sum(result.rows_sent.values()) - sum(kept.values())


def dropped_rows_in_file(path: Path) -> bool:
    try:
        with wattlab.open(str(path)) as run:
            return any("dropped by the source" in g.reason for g in run.gaps)
    except Exception:  # caught between two writes
        return False


def rows_after_the_kill(path: Path) -> bool:
    """The file has gpu0.power rows after the killed source's gap row: it was restarted."""
    try:
        with wattlab.open(str(path)) as run:
            ends = [g.time_last_ns or 0 for g in run.gaps if "killed" in g.reason]
            return bool(ends) and int(run.source("gpu0.power").time_ns[-1]) > max(ends)
    except Exception:  # caught between two writes
        return False


def stop_recorder_until_rows(acquirer: CountingAcquirer, recorder: int) -> None:
    """SIGSTOP the recorder until the source produced far more than its queues hold."""
    os.kill(recorder, signal.SIGSTOP)
    start = acquirer.rows
    wait_until(lambda: acquirer.rows - start >= ROWS_WHILE_AWAY, "rows while the recorder is away")


@pytest.mark.system
@pytest.mark.parametrize("stalls_at_end", [False, True], ids=["comes-back", "stalls-at-end"])
def test_a_recorder_away_past_the_sources_queues_loses_rows_in_gap_rows_and_exits_1(
        tmp_path: Path, stalls_at_end: bool) -> None:
    """Away longer than replay window + backlog: batches dropped at the source.

    comes-back: the recorder resumes and writes the sources' gap rows (before: exit 0).
    stalls-at-end: once those gap rows are in the file it stops again, is killed after
    the stop timeout and the file repaired by the session; the cut-off gap rows count only
    what the sources' gap rows do not (before: the dropped rows were counted twice).
    """
    flag = tmp_path / "end"
    acquirer = CountingAcquirer()
    session = Session(str(tmp_path / "run.h5"), [("gpu0", acquirer)], command=workload(flag),
                      window_bytes=TINY_QUEUE_BYTES, backlog_bytes=TINY_QUEUE_BYTES,
                      stop_timeout_s=2.0)
    recorder = 0
    try:
        with running(session) as box:
            recorder = recorder_pid()
            wait_for_rows(tmp_path / "run.h5", "gpu0.power")
            stop_recorder_until_rows(acquirer, recorder)
            os.kill(recorder, signal.SIGCONT)
            if stalls_at_end:
                wait_until(lambda: dropped_rows_in_file(tmp_path / "run.h5"),
                           "the sources' gap rows in the file")
                os.kill(recorder, signal.SIGSTOP)
            flag.touch()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(recorder, signal.SIGCONT)
    result = box["result"]
    assert (result.salvage is None) != stalls_at_end
    assert check_rows_accounted(result) > 0
    assert exit_status(result) == 1


@pytest.mark.system
def test_a_source_killed_and_restarted_exits_1(tmp_path: Path) -> None:
    """--restart-sources: the killed source's gap row says samples were lost (before: exit 0)."""
    flag = tmp_path / "end"
    path = tmp_path / "run.h5"
    session = Session(str(path), [], command=workload(flag), restart_sources=True,
                      source_specs=[SourceSpec("gpu0", "nvml", simulate=True)])
    with running(session) as box:
        def source_pids() -> list[int]:
            return [pid for pid, cmd in children(os.getpid()).items() if '"name": "gpu0"' in cmd]

        wait_until(source_pids, "the source process")
        [first] = source_pids()
        wait_for_rows(path, "gpu0.power")
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: rows_after_the_kill(path), "rows of the restarted source")
        flag.touch()
    result = box["result"]
    assert result.source_restarts == {"gpu0": 1} and not result.source_errors
    with wattlab.open(str(path)) as run:
        assert any("killed by SIGKILL" in g.reason for g in run.gaps)
    assert exit_status(result) == 1
