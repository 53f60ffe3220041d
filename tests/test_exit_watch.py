"""Waiting for processes without polling: ExitWatch, the idle recorder, the idle session.

Wake-ups are counted from /proc (a thread's context switches), so "sleeps until something
happens" is checked directly, not inferred from timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import pytest

import wattlab
from wattlab import exit_watch
from wattlab.acquisition.acquirers.nvml_acquirer import NvmlAcquirer
from wattlab.acquisition.session.supervisor import Session
from wattlab.drivers.nvml import NvmlDriver
from wattlab.exit_watch import POLL_FALLBACK_S, ExitWatch
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import SimulatedGpu
from wattlab.runfile.crash_flags import crash_flags
from wattlab.sync.bus.publisher import local_endpoint
from wattlab.sync.recorder import process as recorder_module
from wattlab.sync.recorder.process import RecorderConfig

from .conftest import RunningRecorder, Spawn, reap
from .test_faults_session import child_pid, children, finish, record, wait_for_rows

HAS_PIDFD = hasattr(os, "pidfd_open")
needs_pidfd = pytest.mark.skipif(not HAS_PIDFD, reason="needs Linux pidfds")
needs_proc = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")


def sleeper(spawn: Spawn, seconds: float) -> subprocess.Popen[bytes]:
    return spawn([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def switches(tid: int, pid: int | None = None) -> int:
    """Context switches of one thread so far: each wake-up adds at least one."""
    status = Path(f"/proc/{pid or os.getpid()}/task/{tid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])


def wakes_while(tid: int, seconds: float, pid: int | None = None) -> int:
    before = switches(tid, pid)
    time.sleep(seconds)
    return switches(tid, pid) - before


def timed_wait(watch: ExitWatch, processes: list[subprocess.Popen[bytes]],
               timeout_s: float | None) -> float:
    t0 = time.monotonic()
    watch.wait(processes, timeout_s)
    return time.monotonic() - t0


# ---------------------------------------------------------------------------- ExitWatch


@pytest.fixture
def watch():
    w = ExitWatch()
    yield w
    w.close()


@pytest.mark.system
def test_wait_ends_when_the_process_ends(watch, spawn):
    child = sleeper(spawn, 0.3)
    waited_s = timed_wait(watch, [child], 30)
    assert child.wait(5) == 0
    assert 0.2 <= waited_s < 10


@pytest.mark.system
def test_wait_times_out_while_the_process_lives(watch, spawn):
    child = sleeper(spawn, 30)
    waited_s = timed_wait(watch, [child], 0.2)
    assert child.poll() is None
    assert 0.19 <= waited_s < 5


@pytest.mark.system
def test_wake_from_another_thread_ends_the_wait(watch, spawn):
    child = sleeper(spawn, 30)
    threading.Timer(0.2, watch.wake).start()
    assert timed_wait(watch, [child], None) < 10


@pytest.mark.fast
def test_a_wake_before_the_wait_is_not_lost_and_counts_once(watch):
    watch.wake()
    watch.wake()
    assert timed_wait(watch, [], 10) < 1  # the earlier wakes end this wait at once
    assert timed_wait(watch, [], 0.2) >= 0.19  # and only this one


@pytest.mark.system
def test_a_reaped_process_is_no_longer_watched(watch, spawn):
    child = sleeper(spawn, 0)
    child.wait()
    assert timed_wait(watch, [child], 0.3) >= 0.29  # else every later wait would end at once


@pytest.mark.system
@needs_proc
def test_a_process_ended_but_not_reaped_ends_the_wait_at_once(watch, spawn):
    child = sleeper(spawn, 0)
    while _running(child.pid):
        time.sleep(0.01)  # until a zombie: ended, not reaped
    assert timed_wait(watch, [child], 10) < 1
    assert child.poll() == 0


@pytest.mark.system
@needs_pidfd
@needs_proc
def test_with_pidfds_the_waiting_thread_does_not_wake(spawn):
    child = sleeper(spawn, 30)
    watch = ExitWatch()
    waiter = threading.Thread(target=watch.wait, args=([child], None))
    try:
        waiter.start()
        time.sleep(0.2)
        assert waiter.native_id is not None
        assert wakes_while(waiter.native_id, 1.3) == 0  # polling would have woken twice
        child.kill()
        waiter.join(10)
        assert not waiter.is_alive()  # the end of the process woke it
    finally:
        child.kill()
        child.wait()
        watch.close()


@pytest.mark.system
@pytest.mark.parametrize("pidfd_open", [None, "refused"], ids=["missing", "refused"])
def test_without_pidfds_the_wait_looks_every_half_second(monkeypatch, pidfd_open, spawn):
    def refuse(pid: int) -> int:
        raise PermissionError(1, "Operation not permitted")  # as a seccomp sandbox does

    monkeypatch.setattr(exit_watch, "_pidfd_open", None if pidfd_open is None else refuse)
    child = sleeper(spawn, 30)
    watch = ExitWatch()
    try:
        waited_s = timed_wait(watch, [child], None)  # no pidfd: cannot wait for ever
        assert POLL_FALLBACK_S - 0.01 <= waited_s < POLL_FALLBACK_S + 2
        child.kill()
        child.wait()
        assert timed_wait(watch, [], 0.05) < 1  # nothing to watch: the timeout holds
    finally:
        child.kill()
        child.wait()
        watch.close()


@pytest.mark.system
def test_open_pidfd_of_a_process_that_is_gone_raises(spawn):
    child = sleeper(spawn, 0)
    child.wait()
    if not HAS_PIDFD:
        assert exit_watch.open_pidfd(child.pid) is None
        return
    with pytest.raises(ProcessLookupError):
        exit_watch.open_pidfd(child.pid)


@pytest.mark.fast
def test_wake_and_close_after_close_do_nothing():
    watch = ExitWatch()
    watch.close()
    watch.wake()  # a late Ctrl-C after the session ended: no write to a closed descriptor
    watch.close()


# ---------------------------------------------------------------------------- recorder


@pytest.mark.system
@needs_pidfd
@needs_proc
def test_idle_recorder_sleeps_until_a_message_comes(tmp_path):
    rec = RunningRecorder(str(tmp_path / "idle.h5"), parent_pid=os.getppid(),
                          swmr_after_s=0.2, flush_interval_s=0.1)
    try:
        time.sleep(1.0)  # started, SWMR on, nothing left to flush
        assert rec.thread.native_id is not None
        assert wakes_while(rec.thread.native_id, 2.5) == 0  # the old loop woke every 2 s
    finally:
        rec.stop()


@pytest.mark.system
@needs_proc
def test_without_a_pidfd_the_recorder_still_looks_for_its_session(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_module, "open_pidfd", lambda pid: None)
    rec = RunningRecorder(str(tmp_path / "look.h5"), parent_pid=os.getppid(),
                          swmr_after_s=0.2, flush_interval_s=0.1)
    try:
        time.sleep(1.0)
        assert rec.thread.native_id is not None
        assert wakes_while(rec.thread.native_id, 2.5) >= 1  # every IDLE_WAKE_MS
    finally:
        rec.stop()


LAUNCHER = """
import json, os, subprocess, sys, time
config = json.loads(sys.argv[1])
config["parent_pid"] = os.getpid()  # this process plays the session
recorder = subprocess.Popen([sys.executable, "-m", "wattlab.sync.recorder", json.dumps(config)])
print(recorder.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.system
@needs_proc
def test_recorder_closes_the_file_when_its_session_is_killed(tmp_path, spawn):
    """The session dies by SIGKILL: the orphaned recorder sees it and closes the file."""
    path = tmp_path / "orphan.h5"
    config = RecorderConfig(endpoint=local_endpoint(), output=str(path), session_start_ns=0,
                            root_attrs={"command": "[]"}, swmr_after_s=0.2,
                            flush_interval_s=0.1)
    launcher = spawn([sys.executable, "-c", LAUNCHER, config.to_json()], stdout=subprocess.PIPE)
    assert launcher.stdout is not None
    recorder_pid = int(launcher.stdout.readline())
    launcher.stdout.close()
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # running and idle
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    while time.monotonic() < deadline and _running(recorder_pid):
        time.sleep(0.05)
    assert not _running(recorder_pid), "the orphaned recorder never stopped"
    assert crash_flags(str(path)) == 0  # closed by the writer, not left open
    with h5py.File(path, "r") as f:
        assert f.attrs["command"] == "[]"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ---------------------------------------------------------------------------- session


def simulated_acquirer() -> NvmlAcquirer:
    driver = NvmlDriver(FakeNvml([SimulatedGpu(seed=1)]))
    return NvmlAcquirer(driver, 0, streams="samples,energy",
                        intervals_s={"drain": 1.8, "emit": 6.0, "energy": 60.0})


@pytest.mark.system
@needs_pidfd
@needs_proc
def test_session_supervisor_and_command_wait_sleep_until_something_happens(tmp_path):
    """With a command and no --duration the old loops woke 2 + 2 times a second."""
    session = Session(str(tmp_path / "quiet.h5"), [("gpu0", simulated_acquirer())],
                      command=[sys.executable, "-c", "import time; time.sleep(4)"])
    wakes: dict[str, int] = {}

    def probe() -> None:
        deadline = time.monotonic() + 30
        supervisor = None
        while supervisor is None and time.monotonic() < deadline:
            supervisor = next((t for t in threading.enumerate() if t.name == "supervisor"), None)
            time.sleep(0.05)
        assert supervisor is not None and supervisor.native_id is not None
        time.sleep(0.5)  # the workload is running
        main_id = threading.main_thread().native_id
        assert main_id is not None
        before = {"supervisor": switches(supervisor.native_id), "session": switches(main_id)}
        time.sleep(2.0)
        wakes.update({"supervisor": switches(supervisor.native_id) - before["supervisor"],
                      "session": switches(main_id) - before["session"]})

    prober = threading.Thread(target=probe)
    prober.start()
    result = session.run()
    prober.join()
    assert result.command_exit_code == 0
    assert wakes == {"supervisor": 0, "session": 0}


@pytest.mark.system
@needs_pidfd
@needs_proc
def test_a_source_process_sleeps_until_stopped_or_orphaned(tmp_path, spawn):
    """Its main thread once looked 5 times a second for a stop, its runner and its parent."""
    path = tmp_path / "processes.h5"
    session = record(spawn, path, "--source-processes", duration_s=60.0)
    try:
        # not the recorder
        source = child_pid(session, "-m wattlab.acquisition.session.source_child")
        wait_for_rows(path)  # opened and running
        idle = wakes_while(source, 2.0, pid=source)  # its main thread: tid = pid
        session.send_signal(signal.SIGTERM)  # then the stop wakes it at once
        code, err = finish(session)
    finally:
        reap(session)
    assert code == 130, err
    assert idle == 0
    with wattlab.open(str(path)) as run:
        assert run.gaps == [], run.gaps  # every source said "end"


@pytest.mark.system
@needs_proc
def test_session_killed_by_sigkill_its_processes_close_the_file(tmp_path, spawn):
    """The recorder and the source processes see their parent die, finish and exit."""
    path = tmp_path / "orphaned.h5"
    session = record(spawn, path, "--source-processes", duration_s=60.0)
    try:
        wait_for_rows(path)
        orphans = list(children(session.pid))
        assert len(orphans) == 3  # the recorder and two source processes
        session.send_signal(signal.SIGKILL)
        session.wait(timeout=10)  # not communicate: the orphans hold its pipes until they end
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(_running, orphans)):
            time.sleep(0.05)
        session.communicate(timeout=10)
    finally:
        reap(session)
    assert not any(map(_running, orphans)), "a process outlived its session"
    assert crash_flags(str(path)) == 0
    with wattlab.open(str(path)) as run:
        assert run.gaps == [], run.gaps  # every source said "end" before the file closed
        assert len(run.source("gpu0.power")) > 0 and len(run.source("gpu1.power")) > 0
