"""Fixtures and helpers shared by the test modules, each written once.

Plain helpers (``running``, ``free_port``, ``reap``) are imported as
``from tests.conftest import ...``; fixtures (``spawn``) are found by pytest. Session-scoped
artefacts are read-only: a test that writes into one works on its own copy.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import pyvisa
import zmq
from hypothesis import settings

from tests import tiers
from tests.data_files import H100_CAPTURE, data_file
from wattlab.cli import main
from wattlab.hardware.emulators.pty_device import PtyDevice
from wattlab.hardware.emulators.scpi_server import ScpiDevice
from wattlab.importers.power_logs import import_files
from wattlab.samples import Channel, SampleBatch, SourceDescriptor
from wattlab.sync.bus import message
from wattlab.sync.bus.publisher import BusPublisher, ControlClient, local_endpoint
from wattlab.sync.recorder.process import Recorder, RecorderConfig
from wattlab.testing import pytest_plugin

Emulator = TypeVar("Emulator", bound=ScpiDevice | PtyDevice)
Spawn = Callable[..., subprocess.Popen[Any]]


def pytest_configure(config: pytest.Config) -> None:
    """Run as from a terminal: Ctrl-C (SIGINT) at Python's default, not ignored.

    A shell starts a background job (``bash .ci/run &``, nohup) with SIGINT ignored, every
    child inherits that, and a Python started so never raises KeyboardInterrupt: each test
    that stops an emulator or a recording with Ctrl-C then hangs until its timeout (seen:
    six such tests in one CI run started in the background). And wattlab's own pytest
    plugin is loaded, as an installed wattlab loads it, and the tiers are declared and
    checked (tests/tiers.py).
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    load_wattlab_plugin(config)
    tiers.configure(config)
    choose_hypothesis_profile()


def choose_hypothesis_profile() -> None:
    """Under CI (``CI`` set, as CI services and bench/suite_runs.py set it) the property tests
    draw the same examples every run: a red CI is then this commit's doing, reproducible,
    never an unlucky draw. A developer's run explores new examples (and keeps what fails in
    .hypothesis/ to replay); a defect found there is pinned with ``@example``.
    """
    settings.register_profile("ci", derandomize=True, database=None)
    if os.environ.get("CI"):
        settings.load_profile("ci")


def load_wattlab_plugin(config: pytest.Config) -> None:
    """The driver-test fixtures (``expected_protocol``, ``expected_scpi``) in every test.

    An installed wattlab brings them through its ``pytest11`` entry point, named
    ``wattlab``; a checkout run with ``PYTHONPATH=src`` (or an install made before the entry
    point existed) has none, so the plugin is registered here under the same name, once.
    """
    if not config.pluginmanager.has_plugin("wattlab"):
        config.pluginmanager.register(pytest_plugin, "wattlab")


def emulator_failures(device: ScpiDevice | PtyDevice) -> list[str]:
    """What went wrong on the emulator's own threads, which the driver under test may never
    see (a dead device thread only stops answering)."""
    if isinstance(device, ScpiDevice):
        return list(device.handler_errors)
    return [] if device.error is None else [repr(device.error)]


@contextmanager
def running(device: Emulator) -> Iterator[Emulator]:
    """Start an emulator, yield it, stop it, then fail if its own threads failed.

    Every emulator test goes through here so that the check after the close cannot be
    forgotten. A test that provokes a handler failure on purpose asserts on
    ``handler_errors`` itself and does not use this.
    """
    with device:
        yield device
    failures = emulator_failures(device)
    assert failures == [], f"the emulator's own threads failed: {failures}"


@contextmanager
def emulator_cli(argv: list[str], env: dict[str, str] | None = None
                 ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """An emulator's command line as a person runs it: yields the process and the first line
    it prints (its port or VISA resource). ``env`` adds to the environment (a plugin's path).

    However the test ends, the process is gone and its pipes closed afterwards: a process
    left running is a ResourceWarning in some later test, which ``filterwarnings = error``
    makes that test fail instead of this one.
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline()
    finally:
        reap(proc)


def reap(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc`` if it still runs, close its pipes and wait for it.

    Why: a process left running, or its pipes left open, by a test that failed before its
    own cleanup is garbage-collected during some later test; the ResourceWarning it raises
    there ("subprocess N is still running", "unclosed file") fails that innocent test under
    ``filterwarnings = error`` instead of this one (seen in CI: test_prometheus's failure
    failed test_repair next).
    """
    if proc.poll() is None:
        proc.kill()
    with proc:  # Popen.__exit__ closes stdin, stdout and stderr, then waits
        pass


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """``start(argv, **popen_kwargs)``: ``subprocess.Popen`` with those arguments unchanged,
    and every process it started reaped (``reap``) after the test, passed or failed."""
    started: list[subprocess.Popen[Any]] = []

    def start(argv: Any, **popen_kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(argv, **popen_kwargs)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            reap(proc)


def ctrl_c(proc: subprocess.Popen[str], timeout_s: float) -> int:
    """Press Ctrl-C on ``proc``; its exit status (a hang past ``timeout_s`` fails)."""
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout_s)


def timed(command: Callable[[], object]) -> tuple[float, float]:
    """When ``command`` ran, bracketed on the host's monotonic clock: before the call, after
    it returned. For a command the driver waits on (an SCPI driver reads the error queue
    after each one) the instrument handled it inside the bracket, so what it timed between
    two commands lies between the inner and the outer span of their brackets, however late
    a loaded machine ran them (a fixed sleep only says what the test asked for)."""
    before = time.monotonic()
    command()
    return before, time.monotonic()


def free_port() -> int:
    """A loopback TCP port the OS just handed out and took back.

    Nothing listens there until someone binds it, so it serves both as "nothing listens
    here" (unlike a fixed :1 or :9, which a service on the machine may own) and as a port
    for a subprocess to listen on.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def rm() -> Iterator[Any]:
    """A pyvisa-py resource manager (the driver's real VISA layer), closed after the test."""
    manager = pyvisa.ResourceManager("@py")
    yield manager
    manager.close()


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CurveZMQ key pairs made by ``wattlab keys``: recorder, node1, node2 and intruder;
    ``allowed/`` holds the public keys of node1 and node2 only."""
    folder = tmp_path_factory.mktemp("keys")
    assert main(["keys", "recorder", "node1", "node2", "intruder", "-d", str(folder)]) == 0
    allowed = folder / "allowed"
    allowed.mkdir()
    for name in ("node1", "node2"):
        (allowed / f"{name}.key").write_bytes((folder / f"{name}.key").read_bytes())
    return folder


@pytest.fixture(scope="session")
def h100_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The H100 capture in tests/data imported as a run file (source prefix ``h100``)."""
    path = tmp_path_factory.mktemp("h100") / "h100.h5"
    import_files("nvml-npz", [str(H100_CAPTURE)], str(path), names=["h100"])
    return path


@pytest.fixture(scope="session")
def demo_run() -> Path:
    """A 24 s ``wattlab demo`` recording (simulated GPU, emulated PowerSensor3 and wall
    meter), recorded once on a quiet machine and shipped in tests/data/demo (its README).

    Why shipped: the analysis of a demo run (calibration, energy by phase, the node's wall
    share) must not depend on how loaded the test machine is; a live demo under load loses
    meter frames and the calibration then fits another run. test_cli's demo test still
    records a live one and checks what it reports against what happened.
    """
    return data_file("demo/demo24.h5")


@pytest.fixture(scope="session")
def simulated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1 s ``wattlab record --simulate`` recording made by the command in its own process,
    for tests that only read a plain recording."""
    path = tmp_path_factory.mktemp("simulated") / "run.h5"
    done = subprocess.run([sys.executable, "-m", "wattlab.cli", "record", "--simulate",
                           "--duration", "1", "-o", str(path)],
                          capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    return path


def assert_exit_matches_loss(code: int, path: Path) -> None:
    """A recording exits 0 with no gap row, or 1 with gap rows that say what was lost.

    Why not "no gaps": an emulated meter served in real time loses frames when the machine
    is loaded (issue 34); what must hold then is that the loss is reported (a gap row with
    its reason) and that the command does not exit 0 after it (issue 36).
    """
    import wattlab

    with wattlab.open(str(path)) as run:
        gaps = run.gaps
    if code == 0:
        assert gaps == [], gaps
    else:
        assert code == 1 and gaps and all(g.reason for g in gaps), (code, gaps)


def descriptor(source_id: str = "meter", width: int = 2, dtype: str = "<f4") -> SourceDescriptor:
    """A test stream of ``width`` W channels."""
    channels = tuple(Channel(f"power{i}_w", "W", f"rail {i}") for i in range(width))
    return SourceDescriptor(source_id, "test", "Bench 9000", channels, value_dtype=dtype)


def batch(source_id: str, seq: int, n: int = 100, width: int = 2, t0: int = 0) -> SampleBatch:
    """Batch ``seq`` of a test stream: ``n`` rows 1 µs apart, values that name the batch."""
    t = t0 + seq * n * 1000 + np.arange(n, dtype=np.int64) * 1000
    values = (np.arange(n * width, dtype=np.float32).reshape(n, width) + seq).astype("<f4")
    return SampleBatch(source_id, seq, t, values)


def synced(sock: zmq.Socket, timeout_ms: int = 5000) -> None:
    """Wait until the recorder has handled everything ``sock`` sent (FIFO per pipe): a bound
    on what must have happened, where a sleep would only guess how long it takes."""
    rid = uuid.uuid4().hex
    sock.send_multipart(message.encode_control("sync", rid=rid))
    while True:
        assert sock.poll(timeout_ms), "no sync reply"
        if message.decode_header(sock.recv_multipart()).get("rid") == rid:
            return


class RunningRecorder:
    """A recorder on a thread writing ``path``, stopped through the real control path."""

    def __init__(self, path: str, endpoint: str | None = None, **config: object) -> None:
        self.path = path
        self.endpoint = endpoint or local_endpoint()
        self.recorder = Recorder(
            RecorderConfig(endpoint=self.endpoint, output=path, session_start_ns=0,
                           root_attrs={"command": "[]"}, **config)  # type: ignore[arg-type]
        )
        self.final: dict[str, object] = {}
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        self.final = self.recorder.run()

    def publisher(self, *streams: SourceDescriptor, **options: Any) -> BusPublisher:
        """A client of this recorder (``BusPublisher`` options) that described ``streams``."""
        pub = BusPublisher(self.endpoint, **options)
        for stream in streams:
            pub.announce(stream)
        return pub

    @contextmanager
    def raw_client(self) -> Iterator[zmq.Socket]:
        """A bare DEALER socket on the bus (forged, flooding or out-of-order messages),
        closed without lingering however the test ends."""
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        try:
            yield sock
        finally:
            sock.close(0)

    def stop(self) -> dict[str, object]:
        control = ControlClient(self.endpoint)
        try:
            reply = control.request("stop", timeout_s=20)
        finally:
            control.close()
        self.thread.join(20)
        return reply


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Callable[..., RunningRecorder]]:
    """``start(name="run.h5", **config)``: a ``RunningRecorder`` writing ``tmp_path/name``
    (``RecorderConfig`` options), and every one the test left running stopped after it:
    a recorder thread left behind by a failed test holds its socket and its file open
    into later tests."""
    started: list[RunningRecorder] = []

    def start(name: str = "run.h5", **config: object) -> RunningRecorder:
        rec = RunningRecorder(str(tmp_path / name), **config)
        started.append(rec)
        return rec

    try:
        yield start
    finally:
        for rec in started:
            if rec.thread.is_alive():
                rec.stop()
