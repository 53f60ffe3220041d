"""Sources in their own processes: built from a JSON spec, supervised, restartable.

Why processes: a source that crashes, hangs in a driver or is killed must not take the
session (or the other sources) with it, and the supervisor can only restart what it can
kill. The child builds its acquirer from a :class:`SourceSpec` (plain JSON: no objects
cross the process boundary), runs the usual :class:`SourceRunner`, reports its
descriptors (or why it could not open) on a pipe, at its end the rows it sent per stream
on the same pipe (so the session knows them even when the recorder died), and stops
cleanly on SIGTERM or when its parent disappears. Ctrl-C is the session's to handle, so
the child ignores SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO, Any

from wattlab.acquisition.acquirers import Acquirer
from wattlab.acquisition.session.source_runner import (
    SOURCE_BACKLOG_BYTES,
    SOURCE_LINGER_S,
    SOURCE_WINDOW_BYTES,
    SourceRunner,
)
from wattlab.errors import UsageError, WattlabError
from wattlab.exit_watch import ExitWatch
from wattlab.samples import SourceDescriptor

EXIT_SOURCE_FAILED = 1  # the acquirer failed; the child already sent the gap and "end"
EXIT_OPEN_FAILED = 2
ABANDON_WAIT_S = 2.0  # a child whose recorder is gone: time to close its instrument
SPEC_KINDS = ("nvml", "meter")


@dataclass(frozen=True)
class SourceSpec:
    """What a child process needs to build one acquirer (JSON in, JSON out)."""

    name: str
    kind: str  # "nvml" (a GPU, real or simulated) or "meter" (a --meter spec)
    meter: str = ""
    meter_options: str = ""  # JSON: a bench entry's options (rails, gpu, ...) for the meter
    gpu_index: int = 0
    simulate: bool = False
    simulated_gpus: int = 1
    seed: int = 0
    nvml_streams: str = "all"  # what --nvml-streams says
    nvml_intervals: str = ""  # what --nvml-intervals says
    shared_processes: int = 0  # what --shared-processes says
    process_cmdlines: bool = False  # what --process-cmdlines says

    def __post_init__(self) -> None:
        if self.kind not in SPEC_KINDS:
            raise UsageError(f"source spec {self.name!r}: kind {self.kind!r} is not one of "
                             f"{SPEC_KINDS}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> SourceSpec:
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise TypeError("not an object")
            return SourceSpec(**obj)
        except (ValueError, TypeError) as e:
            raise UsageError(f"bad source spec {text[:200]!r}: {e}") from e

    def build(self) -> tuple[Acquirer, Callable[[], None]]:
        """The acquirer and what to release after it closed."""
        if self.kind == "meter":
            from wattlab.acquisition.meters import parse_meter_spec

            return parse_meter_spec(self.meter).acquirer(self.meter_options), lambda: None
        from wattlab.acquisition.acquirers import NvmlAcquirer, parse_intervals
        from wattlab.drivers.nvml import NvmlDriver

        lib = None
        if self.simulate:
            from wattlab.hardware.shared_gpu import simulated_nvml

            lib = simulated_nvml(self.simulated_gpus, self.seed, self.shared_processes)
        intervals_s = parse_intervals(self.nvml_intervals)
        driver = NvmlDriver(lib)
        driver.open()
        return (NvmlAcquirer(driver, self.gpu_index, streams=self.nvml_streams,
                             intervals_s=intervals_s, process_cmdlines=self.process_cmdlines),
                driver.close)


class ProcessSourceRunner:
    """Parent side of one source process; the same surface as ``SourceRunner``."""

    def __init__(
        self, spec: SourceSpec, endpoint: str, *, window_bytes: int = SOURCE_WINDOW_BYTES,
        backlog_bytes: int = SOURCE_BACKLOG_BYTES, linger_s: float = SOURCE_LINGER_S,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.endpoint = endpoint
        self.window_bytes = window_bytes
        self.backlog_bytes = backlog_bytes
        self.linger_s = linger_s
        self.descriptors: list[SourceDescriptor] = []
        self.error: str | None = None
        self.restarts = 0
        # rows sent per stream, summed over the children that reported them (a child
        # killed before its end reports nothing: its streams' counts are then short)
        self.rows_sent: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._status_fd: int | None = None
        self._status: IO[bytes] | None = None  # the child's pipe, read again at its end
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, open_timeout_s: float = 30.0, continue_seq: bool = False
              ) -> list[SourceDescriptor]:
        """Start the child and wait until its instrument is open (or failed to open)."""
        self.launch(continue_seq)
        return self.wait_open(open_timeout_s)

    def launch(self, continue_seq: bool = False) -> None:
        """Start the child without waiting (sessions start all their children at once)."""
        self._collect_rows_sent()  # a child that died: what it said before it went
        read_fd, write_fd = os.pipe()
        args = [sys.executable, "-m", "wattlab.acquisition.session.source_child",
                self.spec.to_json(), self.endpoint, "--status-fd", str(write_fd), "--window-bytes",
                str(self.window_bytes), "--backlog-bytes", str(self.backlog_bytes),
                "--linger-s", str(self.linger_s)]
        if continue_seq:
            args.append("--continue-seq")
        self._stopping = False
        try:
            self._proc = subprocess.Popen(args, pass_fds=(write_fd,))
        except OSError:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self._status_fd = read_fd

    def wait_open(self, open_timeout_s: float = 30.0) -> list[SourceDescriptor]:
        """The child's report: its descriptors, or why its instrument did not open."""
        if self._status_fd is None or self._proc is None:
            raise WattlabError(f"source {self.name}: not launched")
        status = os.fdopen(self._status_fd, "rb")
        self._status_fd = None
        ready, _, _ = select.select([status], [], [], open_timeout_s)
        reply = _reply(status.readline()) if ready else {}
        if "descriptors" not in reply:
            status.close()
            self.stop(2.0)
            why = reply.get("error") or (f"did not open in {open_timeout_s} s" if not ready
                                         else f"exited with status {self._proc.returncode}")
            # the child's runner already names the source: say it once
            raise WattlabError(f"source {self.name}: {why.removeprefix(f'source {self.name}: ')}")
        self._status = status
        self.descriptors = [SourceDescriptor.from_json(d) for d in reply["descriptors"]]
        return self.descriptors

    def _collect_rows_sent(self) -> None:
        """Add what an ended child reported on its pipe (nothing, if it was killed)."""
        status, self._status = self._status, None
        if status is None:
            return
        with status:
            while select.select([status], [], [], 0)[0]:
                line = status.readline()
                if not line:
                    break
                sent = _reply(line).get("rows_sent")
                if isinstance(sent, dict):
                    for source_id, rows in sent.items():
                        if isinstance(rows, int):
                            self.rows_sent[source_id] = self.rows_sent.get(source_id, 0) + rows

    def request_stop(self) -> None:
        """SIGTERM (once): the child reads what is left, says "end" and closes."""
        if self._stopping:
            return
        self._stopping = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def abandon(self) -> None:
        """The recorder is gone for good (full disk): SIGTERM only.

        ``stop(ABANDON_WAIT_S)`` then gives the child a moment to close its instrument
        before it is killed.
        """
        self.request_stop()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the child; killed after ``timeout_s`` (default: its linger time and 5 s)."""
        self.request_stop()
        if self._proc is None:
            return
        try:
            self._proc.wait(self.linger_s + 5.0 if timeout_s is None else timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._collect_rows_sent()
        code = self._proc.returncode
        if code not in (0, None) and self.error is None:
            self.error = describe_exit(code)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def unstopped_process(self) -> subprocess.Popen[bytes] | None:
        """The child while it has not been told to stop: what a supervisor watches."""
        return None if self._stopping else self._proc

    def died(self) -> int | None:
        """The exit status if the child ended without being told to (else None)."""
        if self._stopping or self._proc is None:
            return None
        return self._proc.poll()


def describe_exit(code: int) -> str:
    """Exit status in words, as the /gaps reason and the session's error show it."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"source process killed by {name}"
    if code == EXIT_SOURCE_FAILED:
        return "source failed (see /gaps)"
    return f"source process exited with status {code}"


def _reply(line: bytes) -> dict[str, Any]:
    """One JSON object line from a child's pipe ({} for anything else)."""
    try:
        reply = json.loads(line) if line else {}
    except ValueError:
        return {}
    return reply if isinstance(reply, dict) else {}


def _report(out: IO[bytes], reply: dict[str, Any]) -> None:
    out.write(json.dumps(reply).encode() + b"\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    """Entry point of a source process (started by ``ProcessSourceRunner``)."""
    parser = argparse.ArgumentParser(prog="wattlab-source")
    parser.add_argument("spec_json")
    parser.add_argument("endpoint")
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--window-bytes", type=int, default=SOURCE_WINDOW_BYTES)
    parser.add_argument("--backlog-bytes", type=int, default=SOURCE_BACKLOG_BYTES)
    parser.add_argument("--linger-s", type=float, default=SOURCE_LINGER_S)
    parser.add_argument("--continue-seq", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop, ended = threading.Event(), threading.Event()
    watch = ExitWatch()  # sleeps until SIGTERM, the runner's end or the session's

    def set_and_wake(event: threading.Event) -> None:
        event.set()
        watch.wake()

    signal.signal(signal.SIGTERM, lambda signum, frame: set_and_wake(stop))
    parent = os.getppid()
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    status = os.fdopen(args.status_fd, "wb")
    try:
        spec = SourceSpec.from_json(args.spec_json)
        acquirer, cleanup = spec.build()
        runner = SourceRunner(spec.name, acquirer, args.endpoint, window_bytes=args.window_bytes,
                              backlog_bytes=args.backlog_bytes, continue_seq=args.continue_seq,
                              on_end=lambda: set_and_wake(ended), linger_s=args.linger_s)
        descriptors = runner.start()
    except WattlabError as e:
        _report(status, {"error": str(e)})
        status.close()
        cleanup()
        watch.close()
        return EXIT_OPEN_FAILED
    _report(status, {"descriptors": [d.to_json() for d in descriptors]})
    try:
        # the session gone (its pidfd; getppid where pidfds are missing): finish cleanly
        while not (stop.is_set() or ended.is_set() or os.getppid() != parent):
            watch.wait([parent], None)
        runner.stop()
        with contextlib.suppress(BrokenPipeError), status:  # no reader: the session is gone
            _report(status, {"rows_sent": runner.rows_sent})
    finally:
        # the interpreter's shutdown restores SIGTERM's default action: a late one must not
        # turn a clean stop into "killed"
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cleanup()
        watch.close()
    if runner.error is not None:
        print(f"wattlab source {spec.name}: {runner.error}", file=sys.stderr)
        return EXIT_SOURCE_FAILED
    return 0

