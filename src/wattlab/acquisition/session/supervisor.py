"""The session supervisor: recorder process, sources, the workload, clean stops.

Order matters for "nothing lost": the recorder starts first, every source is open and
acknowledged (start handshake) before the workload starts, and at the end the sources
say "end" before the recorder is told to stop, so it knows when it has everything.

While the workload runs a supervisor thread watches the processes: a recorder that dies
is restarted on the same file (it resumes from the last flush and the sources resend
what it lacks, see docs/reliability.md); a source process that dies is recorded in
``/gaps`` and, when asked (``restart_sources``), started again, numbering on.

A recorder that is not restarted, or that does not answer ``stop`` in time (a stalled
disk, a flood) and is killed, leaves its file open: the session repairs it itself
(``salvage``), with the rows its sources sent per stream, and the result says so.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wattlab.acquisition.acquirers import Acquirer
from wattlab.acquisition.markers import BUS_ENV
from wattlab.acquisition.session.process_cpu import CpuWindow
from wattlab.acquisition.session.salvage import Salvage, salvage
from wattlab.acquisition.session.source_process import (
    ABANDON_WAIT_S,
    ProcessSourceRunner,
    SourceSpec,
    describe_exit,
)
from wattlab.acquisition.session.source_runner import (
    SOURCE_BACKLOG_BYTES,
    SOURCE_LINGER_S,
    SOURCE_WINDOW_BYTES,
    SourceRunner,
)
from wattlab.errors import BusError, UsageError, WattlabError
from wattlab.exit_watch import ExitWatch
from wattlab.runfile import schema
from wattlab.runtime_env import auto_marker_env, workload_environ
from wattlab.samples import Marker
from wattlab.sync.bus import BusPublisher, ControlClient, private_endpoint
from wattlab.sync.recorder import (
    DISK_FULL_EXIT,
    DiskFullReport,
    RecorderConfig,
    hosts_ready,
    read_report,
)

RECORDER_START_TIMEOUT_S = 20.0
HANDSHAKE_TIMEOUT_S = 15.0
# at the end: how long the recorder may take to answer "stop" (it drains and closes the
# file first), and then to exit after SIGTERM before it is killed
STOP_TIMEOUT_S = 30.0
PROGRESS_TICK_S = 0.05
Runner = SourceRunner | ProcessSourceRunner

if TYPE_CHECKING:
    from wattlab.acquisition.meters import BenchConfig


@dataclass
class SessionResult:
    """A finished session: the file, the workload's exit status, the recorder's counts.

    ``rows_sent``: rows the sources sent per stream (a source process killed before its
    end did not report its own); ``salvage``: set when the recorder did not close the file
    (it died and was not restarted, or stalled and was killed), with what the session's
    repair kept.
    """

    output: str
    command_exit_code: int | None
    recorder_status: dict[str, Any]
    source_errors: dict[str, str]
    interrupted: bool
    recorder_restarts: int = 0
    source_restarts: dict[str, int] = field(default_factory=dict)
    disk_full: DiskFullReport | None = None  # the disk filled: the recording stopped there
    rows_sent: dict[str, int] = field(default_factory=dict)
    salvage: Salvage | None = None


@dataclass
class Session:
    """One recording: some acquirers, optionally a command, into one new run file."""

    output: str
    acquirers: list[tuple[str, Acquirer]]
    command: list[str] | None = None
    duration_s: float | None = None
    root_attrs: dict[str, Any] = field(default_factory=dict)
    bench_config: dict[str, Any] | None = None  # a validated bench file (BenchConfig.to_json)
    auto_markers: bool | str = False  # framework callbacks in a Python workload ("layers":
    # and a phase per leaf module)
    flush_interval_s: float = 0.5
    tail_s: float = 0.0  # keep recording this long after the workload's end marker
    on_progress: Callable[[float], None] | None = None
    # remote agents: RecorderConfig fields listen, server_key, allowed_keys, expected_hosts
    recorder_options: dict[str, Any] = field(default_factory=dict)
    agent_timeout_s: float = 60.0
    # sources in their own processes (built from JSON specs), supervised
    source_specs: list[SourceSpec] = field(default_factory=list)
    restart_sources: bool = False
    max_restarts: int = 3
    restart_recorder: bool = True
    window_bytes: int = SOURCE_WINDOW_BYTES
    backlog_bytes: int = SOURCE_BACKLOG_BYTES
    # the end's waits on the recorder: its answer to "stop", its exit after SIGTERM, and
    # (at most SOURCE_LINGER_S of it) the sources' wait for their last confirmations
    stop_timeout_s: float = STOP_TIMEOUT_S
    _stop: threading.Event = field(default_factory=threading.Event)
    _interrupted: threading.Event = field(default_factory=threading.Event)
    _watch: ExitWatch | None = field(default=None, init=False, repr=False)
    _workload_started: bool = field(default=False, init=False, repr=False)

    def request_stop(self) -> None:
        """Stop at the next opportunity (Ctrl-C / SIGTERM call this): the run is interrupted."""
        self._interrupted.set()
        self._halt()

    def _halt(self) -> None:
        """End the session early for a reason of its own (the recorder is gone)."""
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.wake()

    def _check_output(self) -> None:
        if os.path.exists(self.output):
            raise UsageError(f"{self.output}: already exists; wattlab never overwrites a run file")
        parent = os.path.dirname(os.path.abspath(self.output))
        if not os.path.isdir(parent):
            raise UsageError(f"{self.output}: folder {parent} does not exist")

    def _start_recorder(
        self, endpoint: str, t0_ns: int, expected: list[str], resume: bool = False
    ) -> subprocess.Popen[bytes]:
        attrs = {
            schema.WATTLAB_VERSION: _version(),
            schema.CREATED: dt.datetime.now(dt.UTC).isoformat(),
            schema.HOST: socket.gethostname(),
            schema.SESSION_START_UNIX_NS: time.time_ns() - (time.monotonic_ns() - t0_ns),
            schema.COMMAND: json.dumps(self.command or []),
            schema.BENCH_CONFIG: json.dumps(self.bench_config or {}),
            **self.root_attrs,
        }
        config = RecorderConfig(endpoint=endpoint, output=self.output, session_start_ns=t0_ns,
                                root_attrs=attrs, expected_sources=expected,
                                flush_interval_s=self.flush_interval_s, resume=resume,
                                parent_pid=os.getpid(), **self.recorder_options)
        # stdout: a recorder stopped by a full disk reports there (see sync/recorder/disk_full.py)
        return subprocess.Popen([sys.executable, "-m", "wattlab.sync.recorder", config.to_json()],
                                stdout=subprocess.PIPE)

    def _wait_for(self, control: ControlClient, recorder: subprocess.Popen[bytes],
                  predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._stop.is_set():
                return  # stopping before the workload started: no need to wait
            if recorder.poll() == DISK_FULL_EXIT:
                self._halt()  # the result says where the disk filled
                return
            if recorder.poll() is not None:
                raise WattlabError(f"recorder exited with status {recorder.returncode} ({what})")
            try:
                if predicate(control.request("status", timeout_s=1.0)):
                    return
            except BusError:
                continue
            time.sleep(0.02)
        raise WattlabError(f"timed out after {timeout_s} s waiting for {what}")

    def run(self) -> SessionResult:
        """Record into the new file; a failure before the workload started removes it.

        Such a file holds only start-up rows (issue 38: a typo in the command or a missing
        meter port left one, and the corrected retry said "already exists"). A run whose
        workload started keeps its file whatever happens next.
        """
        self._check_output()
        try:
            with private_endpoint() as endpoint:
                return self._run_on(endpoint)
        except Exception:
            if not self._workload_started:
                with suppress(FileNotFoundError):
                    os.unlink(self.output)  # the recorder has closed it or is gone
            raise

    def _run_on(self, endpoint: str) -> SessionResult:
        t0_ns = time.monotonic_ns()
        window, backlog = self.window_bytes, self.backlog_bytes
        linger_s = min(SOURCE_LINGER_S, self.stop_timeout_s)
        runners: list[Runner] = [
            SourceRunner(name, acq, endpoint, window_bytes=window, backlog_bytes=backlog,
                         linger_s=linger_s)
            for name, acq in self.acquirers]
        runners += [ProcessSourceRunner(spec, endpoint, window_bytes=window, backlog_bytes=backlog,
                                        linger_s=linger_s)
                    for spec in self.source_specs]
        recorder = self._start_recorder(endpoint, t0_ns, [])
        control = ControlClient(endpoint)
        marker_pub = BusPublisher(endpoint, linger_ms=round(linger_s * 1000))
        supervisor = _Supervisor(self, endpoint, t0_ns, recorder, runners)
        exit_code: int | None = None
        cpu = CpuWindow()
        # from here on Ctrl-C / SIGTERM stop the session cleanly, even while it starts
        with _signals_stop(self):
            try:
                self._wait_for(control, recorder, lambda s: True, RECORDER_START_TIMEOUT_S,
                               "the recorder to start")
                expected: list[str] = []
                for runner in runners:
                    if isinstance(runner, ProcessSourceRunner):
                        runner.launch()  # all children start (import, open) at the same time
                for runner in runners:
                    opened = (runner.wait_open() if isinstance(runner, ProcessSourceRunner)
                              else runner.start())
                    expected += [d.source_id for d in opened]
                self._wait_for(control, recorder, lambda s: set(expected) <= set(s["sources"]),
                               HANDSHAKE_TIMEOUT_S, f"the recorder to acknowledge {expected}")
                hosts = list(self.recorder_options.get("expected_hosts", []))
                if hosts:
                    self._wait_for(control, recorder, lambda s: hosts_ready(s, hosts),
                                   self.agent_timeout_s,
                                   f"agents {hosts} to connect and sync clocks")
                supervisor.start()
                cpu.start(_tree_pids(runners, supervisor.recorder))
                marker_pub.send_marker(Marker(time.monotonic_ns(), "session", "begin", "session"))
                exit_code = self._run_workload(endpoint, runners)
                marker_pub.send_marker(Marker(time.monotonic_ns(), "session", "end", "session",
                                              {"command_exit_code": exit_code}))
                self._stop.wait(self.tail_s)  # a stop (Ctrl-C) cuts the tail short
            finally:
                sources_stop_ns = time.monotonic_ns()  # the last readings are from here
                recording_cpu = cpu.end()  # steady state: before the sources stop
                gone = (supervisor.disk_full is not None
                        or supervisor.recorder.poll() == DISK_FULL_EXIT)
                for runner in runners:
                    if gone:
                        runner.abandon()  # nobody will confirm their last batches
                    else:
                        runner.request_stop()
                for runner in runners:
                    if gone:
                        runner.stop(ABANDON_WAIT_S)
                    else:
                        runner.stop()
                marker_pub.close(wait=not gone)
                supervisor.stop()
                status, killed = self._stop_recorder(
                    control, supervisor.recorder,
                    {} if recording_cpu is None else {"recording_cpu": recording_cpu.to_json()})
                control.close()
                disk_full = supervisor.disk_full or _reap(supervisor.recorder)
        errors = {r.name: r.error for r in runners if r.error}
        errors.update(supervisor.errors)
        interrupted = self._interrupted.is_set() and disk_full is None  # Ctrl-C, not the disk
        rows_sent: dict[str, int] = {}
        for runner in runners:
            rows_sent.update(runner.rows_sent)
        lost = killed or _recorder_lost(supervisor.recorder, disk_full)
        return SessionResult(self.output, exit_code, status, errors, interrupted,
                             supervisor.recorder_restarts, dict(supervisor.source_restarts),
                             disk_full, rows_sent,
                             None if lost is None
                             else salvage(self.output, lost, rows_sent, sources_stop_ns))

    def _run_workload(self, endpoint: str, runners: list[Runner]) -> int | None:
        started = time.monotonic()
        child: subprocess.Popen[bytes] | None = None
        if self.command and not self._stop.is_set():
            extra = {BUS_ENV: endpoint}
            if self.auto_markers:
                extra.update(auto_marker_env(workload_environ(), str(self.auto_markers)))
            env = workload_environ(**extra)
            try:
                child = subprocess.Popen(self.command, env=env)
            except OSError as e:
                raise UsageError(f"cannot start command {self.command[0]!r}: {e}") from e
        self._workload_started = child is not None or self.duration_s is not None
        watch = self._watch = ExitWatch()
        try:
            while not self._stop.is_set():
                elapsed = time.monotonic() - started
                if child is not None and child.poll() is not None:
                    break
                if self.duration_s is not None and elapsed >= self.duration_s:
                    break
                if child is None and self.duration_s is None:
                    raise UsageError("nothing to record: give a command or --duration")
                if self.on_progress is not None:
                    self.on_progress(elapsed)
                # no tick without a progress callback: the command's end, a stop and the
                # duration's end each end the wait themselves
                timeout_s = None if self.on_progress is None else PROGRESS_TICK_S
                if self.duration_s is not None:
                    left_s = max(self.duration_s - elapsed, 0.001)
                    timeout_s = left_s if timeout_s is None else min(timeout_s, left_s)
                watch.wait([] if child is None else [child], timeout_s)
        finally:
            self._watch = None
            watch.close()
        if child is None:
            return None
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        return child.returncode

    def _stop_recorder(
        self, control: ControlClient, recorder: subprocess.Popen[bytes],
        stop_fields: dict[str, Any],
    ) -> tuple[dict[str, Any], str | None]:
        """Its final status, and why it had to be killed (None: it stopped by itself).

        ``stop_fields`` go with the stop request (the recording's CPU, for the file).
        """
        status: dict[str, Any] = {}
        killed = None
        if recorder.poll() is None:
            try:
                status = control.request("stop", timeout_s=self.stop_timeout_s, **stop_fields)
            except BusError as e:
                status = {"error": str(e)}
                killed = (f"the recorder did not answer 'stop' within {self.stop_timeout_s:g} s "
                          "and was killed")
                recorder.terminate()
        try:
            recorder.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            killed = killed or (f"the recorder did not exit within {self.stop_timeout_s:g} s "
                                "of 'stop' and was killed")
            recorder.kill()
            recorder.wait()
        return status, killed


def _tree_pids(runners: list[Runner], recorder: subprocess.Popen[bytes]
               ) -> dict[str, int | None]:
    """The recording's processes by role.

    The session (with its in-process sources), each source process by its name, the recorder.
    """
    pids: dict[str, int | None] = {"session": os.getpid()}
    for runner in runners:
        if isinstance(runner, ProcessSourceRunner):
            role = runner.name if runner.name not in ("session", "recorder") else (
                f"source {runner.name}")
            pids[role] = runner.pid
    pids["recorder"] = recorder.pid
    return pids


class _Supervisor:
    """Watches the recorder and the source processes while the session runs (a thread).

    It has its own control socket (ZeroMQ sockets are not shared between threads).
    """

    def __init__(self, session: Session, endpoint: str, t0_ns: int,
                 recorder: subprocess.Popen[bytes], runners: list[Runner]) -> None:
        self.session = session
        self.endpoint = endpoint
        self.t0_ns = t0_ns
        self.recorder = recorder
        self.runners = runners
        self.recorder_restarts = 0
        self.source_restarts: dict[str, int] = {}
        self.errors: dict[str, str] = {}
        self.disk_full: DiskFullReport | None = None
        self._done = threading.Event()
        self._watch = ExitWatch()  # a death is seen at once, with no wake-up until then
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching, once the sources have ended.

        Until then the recorder may still be restarted while they close, so their last
        batches reach the file.
        """
        self._done.set()
        self._watch.wake()
        if self._thread.is_alive():
            self._thread.join(30)
        if not self._thread.is_alive():  # else it may still wait on the watch
            self._watch.close()

    def _run(self) -> None:
        control = ControlClient(self.endpoint)
        try:
            while not self._done.is_set():
                self._watch.wait(self._watched(), None)
                if self._done.is_set():
                    break
                self._check_recorder()
                for runner in self.runners:
                    if isinstance(runner, ProcessSourceRunner):
                        self._check_source(control, runner)
        finally:
            control.close()

    def _watched(self) -> list[subprocess.Popen[bytes]]:
        """The recorder and the source processes not told to stop."""
        sources = [r.unstopped_process for r in self.runners if isinstance(r, ProcessSourceRunner)]
        return [self.recorder, *(p for p in sources if p is not None)]

    def _check_recorder(self) -> None:
        code = self.recorder.poll()
        if code is None:
            return
        report = _reap(self.recorder)
        if code == DISK_FULL_EXIT:  # a new recorder would fail on the same disk
            self.disk_full = report
            self.session._halt()
            self._done.set()
            return
        if not self.session.restart_recorder or self.recorder_restarts >= self.session.max_restarts:
            self.errors["recorder"] = f"recorder exited with status {code}; not restarted"
            self.session._halt()
            self._done.set()
            return
        self.recorder_restarts += 1
        print(f"wattlab: the recorder exited with status {code}; restarting it on "
              f"{self.session.output} (restart {self.recorder_restarts})", file=sys.stderr)
        self.recorder = self.session._start_recorder(self.endpoint, self.t0_ns, [], resume=True)

    def _check_source(self, control: ControlClient, runner: ProcessSourceRunner) -> None:
        code = runner.died()
        if code is None:
            return
        how = describe_exit(code)
        if code != 1:  # status 1: the source said so itself (gap and end already sent)
            for desc in runner.descriptors:
                try:
                    control.request("source_lost", timeout_s=5.0, source_id=desc.source_id,
                                    reason=f"{how}; samples lost")
                except BusError as e:
                    print(f"wattlab: could not tell the recorder about {runner.name}: {e}",
                          file=sys.stderr)
        done = self.source_restarts.get(runner.name, 0)
        if not self.session.restart_sources or done >= self.session.max_restarts:
            runner.stop(1.0)
            self.errors[runner.name] = how
            return
        self.source_restarts[runner.name] = done + 1
        print(f"wattlab: source {runner.name}: {how}; restarting it (restart {done + 1})",
              file=sys.stderr)
        try:
            runner.start(continue_seq=True)
        except WattlabError as e:
            self.errors[runner.name] = f"{how}; restart failed: {e}"
            runner.stop(1.0)


def _recorder_lost(recorder: subprocess.Popen[bytes], disk_full: DiskFullReport | None
                   ) -> str | None:
    """Why the last recorder left its file open (None: it closed it, or the disk filled)."""
    code = recorder.returncode
    if code in (0, None) or disk_full is not None or code == DISK_FULL_EXIT:
        return None
    how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in
           signal.valid_signals() else f"exited with status {code}")
    return f"the recorder {how} and was not restarted"


def _reap(recorder: subprocess.Popen[bytes]) -> DiskFullReport | None:
    """Close an ended recorder's stdout; its full-disk report if it stopped for one."""
    if recorder.stdout is None or recorder.stdout.closed or recorder.returncode is None:
        return None
    text = recorder.stdout.read().decode(errors="replace")
    recorder.stdout.close()
    return read_report(text) if recorder.returncode == DISK_FULL_EXIT else None


@contextmanager
def _signals_stop(session: Session) -> Iterator[None]:
    """Ctrl-C and SIGTERM end the workload and close the run cleanly, not with a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        session.request_stop()

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _version() -> str:
    from wattlab.version import __version__

    return __version__


def record_bench(bench: str | BenchConfig, output: str, *, command: list[str] | None = None,
                 duration_s: float | None = None, **session_options: Any) -> SessionResult:
    """``wattlab record --bench`` from Python: every device of the bench into one new run.

    Returns the session's result; the root attribute ``bench_config`` holds the bench as JSON.
    """
    from wattlab.acquisition.meters import bench_acquirers, load_bench

    config = load_bench(bench) if isinstance(bench, str) else bench
    with bench_acquirers(config) as acquirers:
        session = Session(output, acquirers, command=command, duration_s=duration_s,
                          bench_config=config.to_json(), **session_options)
        return session.run()
