"""The session supervisor: recorder process, source threads, the workload, clean stops.

Order matters for "nothing lost": the recorder starts first, every source is open and
acknowledged (start handshake) before the workload starts, and at the end the sources
say "end" before the recorder is told to stop, so it knows when it has everything.
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from wattlab.acquisition.markers import BUS_ENV
from wattlab.acquisition.source import Acquirer, SourceRunner
from wattlab.errors import BusError, UsageError, WattlabError
from wattlab.runtime_env import workload_environ
from wattlab.samples import Marker
from wattlab.sync.bus import BusPublisher, ControlClient, local_endpoint
from wattlab.sync.recorder import RecorderConfig, hosts_ready

RECORDER_START_TIMEOUT_S = 20.0
HANDSHAKE_TIMEOUT_S = 15.0


@dataclass
class SessionResult:
    """A finished session: the file, the workload's exit status, the recorder's counts."""

    output: str
    command_exit_code: int | None
    recorder_status: dict[str, Any]
    source_errors: dict[str, str]
    interrupted: bool


@dataclass
class Session:
    """One recording: some acquirers, optionally a command, into one new run file."""

    output: str
    acquirers: list[tuple[str, Acquirer]]
    command: list[str] | None = None
    duration_s: float | None = None
    root_attrs: dict[str, Any] = field(default_factory=dict)
    flush_interval_s: float = 0.5
    on_progress: Callable[[float], None] | None = None
    # remote agents: RecorderConfig fields listen, server_key, allowed_keys, expected_hosts
    recorder_options: dict[str, Any] = field(default_factory=dict)
    agent_timeout_s: float = 60.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def request_stop(self) -> None:
        """Stop at the next opportunity (Ctrl-C / SIGTERM call this)."""
        self._stop.set()

    def _check_output(self) -> None:
        if os.path.exists(self.output):
            raise UsageError(f"{self.output}: already exists; wattlab never overwrites a run file")
        parent = os.path.dirname(os.path.abspath(self.output))
        if not os.path.isdir(parent):
            raise UsageError(f"{self.output}: folder {parent} does not exist")

    def _start_recorder(
        self, endpoint: str, t0_ns: int, expected: list[str]
    ) -> subprocess.Popen[bytes]:
        attrs = {
            "wattlab_version": _version(),
            "created": dt.datetime.now(dt.UTC).isoformat(),
            "host": socket.gethostname(),
            "session_start_unix_ns": time.time_ns() - (time.monotonic_ns() - t0_ns),
            "command": json.dumps(self.command or []),
            "bench_config": json.dumps({}),
            **self.root_attrs,
        }
        config = RecorderConfig(endpoint=endpoint, output=self.output, session_start_ns=t0_ns,
                                root_attrs=attrs, expected_sources=expected,
                                flush_interval_s=self.flush_interval_s, **self.recorder_options)
        return subprocess.Popen([sys.executable, "-m", "wattlab.sync.recorder", config.to_json()])

    def _wait_for(self, control: ControlClient, recorder: subprocess.Popen[bytes],
                  predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
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
        self._check_output()
        endpoint = local_endpoint()
        t0_ns = time.monotonic_ns()
        runners = [SourceRunner(name, acq, endpoint) for name, acq in self.acquirers]
        recorder = self._start_recorder(endpoint, t0_ns, [])
        control = ControlClient(endpoint)
        marker_pub = BusPublisher(endpoint)
        exit_code: int | None = None
        try:
            self._wait_for(control, recorder, lambda s: True, RECORDER_START_TIMEOUT_S,
                           "the recorder to start")
            expected: list[str] = []
            for runner in runners:
                expected += [d.source_id for d in runner.start()]
            self._wait_for(control, recorder, lambda s: set(expected) <= set(s["sources"]),
                           HANDSHAKE_TIMEOUT_S, f"the recorder to acknowledge {expected}")
            hosts = list(self.recorder_options.get("expected_hosts", []))
            if hosts:
                self._wait_for(control, recorder, lambda s: hosts_ready(s, hosts),
                               self.agent_timeout_s, f"agents {hosts} to connect and sync clocks")
            with _signals_stop(self):
                marker_pub.send_marker(Marker(time.monotonic_ns(), "session", "begin", "session"))
                exit_code = self._run_workload(endpoint, runners)
                marker_pub.send_marker(Marker(time.monotonic_ns(), "session", "end", "session",
                                              {"command_exit_code": exit_code}))
        finally:
            for runner in runners:
                runner.stop()
            marker_pub.close()
            status = self._stop_recorder(control, recorder)
            control.close()
        errors = {r.name: r.error for r in runners if r.error}
        return SessionResult(self.output, exit_code, status, errors, self._stop.is_set())

    def _run_workload(self, endpoint: str, runners: list[SourceRunner]) -> int | None:
        started = time.monotonic()
        child: subprocess.Popen[bytes] | None = None
        if self.command:
            env = workload_environ(**{BUS_ENV: endpoint})
            try:
                child = subprocess.Popen(self.command, env=env)
            except OSError as e:
                raise UsageError(f"cannot start command {self.command[0]!r}: {e}") from e
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
            self._stop.wait(0.05)
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
        self, control: ControlClient, recorder: subprocess.Popen[bytes]
    ) -> dict[str, Any]:
        status: dict[str, Any] = {}
        if recorder.poll() is None:
            try:
                status = control.request("stop", timeout_s=30.0)
            except BusError as e:
                status = {"error": str(e)}
                recorder.terminate()
        try:
            recorder.wait(30)
        except subprocess.TimeoutExpired:
            recorder.kill()
            recorder.wait()
        return status


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
    from wattlab import __version__

    return __version__
