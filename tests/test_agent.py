"""Agents on "other hosts": separate processes with skewed clocks, several at once, CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import wattlab
from tests.conftest import Spawn, free_port
from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.session.agent import SKEW_ENV, ClockSkew, HostAcquirer, run_agent
from wattlab.cli import main
from wattlab.errors import BusError, UsageError
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor
from wattlab.sync.bus.publisher import ControlClient, local_endpoint
from wattlab.sync.bus.security import ClientSecurity, load_keypair, load_public_key
from wattlab.sync.recorder.process import Recorder, RecorderConfig, hosts_ready

REPO = Path(__file__).resolve().parents[1]
WATTLAB = [sys.executable, "-m", "wattlab.cli"]
GOAL_MEDIAN_NS = 50_000  # issue 5: clock-offset error under 50 µs median, 200 µs p99
GOAL_P99_NS = 200_000


class Ramp:
    """A 1 kHz synthetic meter stamped with the (agent's) host clock."""

    def __init__(self) -> None:
        self.next_ns = 0

    def open(self) -> list[SourceDescriptor]:
        self.next_ns = time.monotonic_ns()
        return [SourceDescriptor("ramp", "test", "Ramp", (Channel("power_w", "W"),))]

    def poll(self) -> list:
        time.sleep(0.02)
        now = time.monotonic_ns()
        t = np.arange(self.next_ns, now, 1_000_000, dtype=np.int64)
        if t.size == 0:
            return []
        self.next_ns = int(t[-1]) + 1_000_000
        return [Chunk("ramp", t, np.ones((t.size, 1)))]

    def close(self) -> None:
        pass


def agent_main() -> None:
    """Entry point of a test agent process: ``python -c ... ENDPOINT KEY SERVER_KEY``."""
    endpoint, key, server_key = sys.argv[1:4]
    security = ClientSecurity(load_keypair(key), load_public_key(server_key))
    result = run_agent(endpoint, security.keys.name, [("ramp", Ramp())], security,
                       skew=ClockSkew.from_env())
    sys.exit(0 if result.finished_by_recorder else 1)


def start_agent(spawn: Spawn, listen: str, keys: Path, name: str, skew: ClockSkew
                ) -> subprocess.Popen[str]:
    env = {**os.environ, SKEW_ENV: f"{skew.offset_ns}:{skew.drift_ppm}"}
    code = "from tests.test_agent import agent_main; agent_main()"
    return spawn(
        [sys.executable, "-c", code, listen, str(keys / f"{name}.key_secret"),
         str(keys / "recorder.key")], cwd=REPO, env=env, text=True, stderr=subprocess.PIPE)


def truth_error_ns(path: str, source_id: str, skew: ClockSkew) -> np.ndarray:
    """Recorded time minus the true recorder-clock time of each sample."""
    with h5py.File(path) as f:
        group = f["sources"][source_id]
        sender = group["time_host_raw"][:]
        recorded = group["time"][:] + int(f.attrs["session_start_monotonic_ns"])
    truth = np.round((sender - skew.offset_ns) / (1 + skew.drift_ppm * 1e-6)).astype(np.int64)
    return recorded - truth


@pytest.mark.system
def test_two_skewed_agents_land_on_the_recorder_timebase(tmp_path, keys, spawn):
    path = str(tmp_path / "run.h5")
    endpoint = local_endpoint()
    recorder = Recorder(RecorderConfig(
        endpoint=endpoint, output=path, session_start_ns=time.monotonic_ns(),
        listen="tcp://127.0.0.1:0", server_key=str(keys / "recorder.key_secret"),
        allowed_keys=str(keys / "allowed"), expected_hosts=["node1", "node2"]))
    thread = threading.Thread(target=recorder.run)
    thread.start()
    skews = {"node1": ClockSkew(3_600_000_000_000, 80.0), "node2": ClockSkew(-2_000_000, -45.0)}
    agents = {n: start_agent(spawn, recorder.listen_endpoint, keys, n, s) for n, s in skews.items()}
    control = ControlClient(endpoint)
    try:
        deadline = time.monotonic() + 30
        while not hosts_ready(control.request("status", 5), list(skews)):
            assert time.monotonic() < deadline, control.request("status", 5)
            time.sleep(0.1)
        time.sleep(6)  # several clock windows: drift needs a baseline
        final = control.request("stop", 30)
    finally:
        control.close()
        thread.join(30)
        errors = {n: a.communicate(timeout=30)[1] for n, a in agents.items()}
    assert {n: a.returncode for n, a in agents.items()} == {"node1": 0, "node2": 0}, errors
    assert final["rejected"] == 0, final["last_rejection"]
    with wattlab.open(path) as run:
        assert set(run.sources) == {"node1.ramp", "node2.ramp"}
        assert run.gaps == []
        for name in skews:
            assert len(run.source(f"{name}.ramp")) > 3000
    for name, skew in skews.items():
        err = np.abs(truth_error_ns(path, f"{name}.ramp", skew))
        assert np.median(err) < GOAL_MEDIAN_NS, (name, np.median(err))
        assert np.percentile(err, 99) < GOAL_P99_NS, (name, np.percentile(err, 99))
    with h5py.File(path) as f:
        for name, skew in skews.items():
            probes = f["sync"][name]["probes"][:]
            assert probes.shape[0] >= 4
            # window-best probes err by 10-45 µs on two busy cores: over the probed span the
            # line's ends may be off by the offset goal, no more
            span_ns = float(probes["remote_ns"][-1] - probes["remote_ns"][0])
            assert span_ns > 5e9
            allowed_ppm = 2 * GOAL_MEDIAN_NS / span_ns * 1e6
            drift_ppm = f["sync"][name].attrs["drift_ppm"]
            assert drift_ppm == pytest.approx(skew.drift_ppm, abs=allowed_ppm)
            assert f["sources"][f"{name}.ramp"].attrs["remote_host"] == name


@pytest.mark.fast
def test_host_acquirer_prefixes_every_stream_and_skews_every_time():
    class Fixed:
        def open(self):
            return [SourceDescriptor("m", "test", "M", (Channel("p_w", "W"),))]

        def poll(self):
            return [Chunk("m", np.array([1000], dtype=np.int64), np.ones((1, 1))),
                    Marker(2000, "tick", source="m"), Gap("m", "lost", t_first_ns=3000)]

        def close(self):
            pass

    acq = HostAcquirer(Fixed(), "node7", ClockSkew(10, 1e6))  # drift 1e6 ppm: doubles time
    [desc] = acq.open()
    assert desc.source_id == "node7.m" and desc.config["agent"] == "node7"
    chunk, marker, gap = acq.poll()
    assert (chunk.source_id, int(chunk.t_host_ns[0])) == ("node7.m", 2010)
    assert (marker.source, marker.t_host_ns) == ("node7.m", 4010)
    assert (gap.source, gap.t_first_ns, gap.t_last_ns) == ("node7.m", 6010, -1)
    assert acq.flush() == []


@pytest.mark.system
def test_agent_needs_tcp_and_something_to_send(keys, monkeypatch, tmp_path):
    security = ClientSecurity(load_keypair(keys / "node1.key_secret"),
                              load_public_key(keys / "recorder.key"))
    with pytest.raises(UsageError, match="tcp://"):
        run_agent(f"ipc://{tmp_path / 'bus.sock'}", "node1", [("r", Ramp())], security)
    with pytest.raises(UsageError, match="nothing to publish"):
        run_agent(f"tcp://127.0.0.1:{free_port()}", "node1", [], security)
    monkeypatch.setenv(SKEW_ENV, "nonsense")
    with pytest.raises(UsageError, match="OFFSET_NS:DRIFT_PPM"):
        ClockSkew.from_env()


@pytest.fixture(scope="module")
def listening(tmp_path_factory, keys):
    """A recorder that accepts node1 and node2 on a loopback port; yields that endpoint."""
    folder = tmp_path_factory.mktemp("listening")
    endpoint = local_endpoint()
    recorder = Recorder(RecorderConfig(
        endpoint=endpoint, output=str(folder / "run.h5"), session_start_ns=time.monotonic_ns(),
        listen="tcp://127.0.0.1:0", server_key=str(keys / "recorder.key_secret"),
        allowed_keys=str(keys / "allowed")))
    thread = threading.Thread(target=recorder.run)
    thread.start()
    control = ControlClient(endpoint)
    try:
        yield recorder.listen_endpoint
    finally:
        control.request("stop", 30)
        control.close()
        thread.join(30)


def unanswered_agent(endpoint: str, key: Path, server_key: Path) -> tuple[str, list[str], float]:
    """Run an agent with a 4 s connect timeout: its error, what it said while waiting, and
    how long it took."""
    security = ClientSecurity(load_keypair(key), load_public_key(server_key))
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(BusError) as e:
        run_agent(endpoint, security.keys.name, [("ramp", Ramp())], security,
                  connect_timeout_s=4.0, say=said.append)
    return str(e.value), said, time.monotonic() - started


@pytest.mark.system
def test_an_agent_whose_key_the_recorder_refuses_says_so_and_gives_up(listening, keys,
                                                                      tmp_path):
    assert main(["keys", "stranger", "-d", str(tmp_path)]) == 0
    error, said, took_s = unanswered_agent(listening, tmp_path / "stranger.key_secret",
                                           keys / "recorder.key")
    assert "refused this agent's key" in error and "stranger.key" in error, error
    assert len(said) == 1 and "refused this agent's key" in said[0], said
    assert "after 3 s" in said[0] and "up to 4 s (--connect-timeout)" in said[0]
    assert 4.0 <= took_s < 8.0


@pytest.mark.system
def test_an_agent_with_the_wrong_server_key_says_so(listening, keys):
    error, said, _ = unanswered_agent(listening, keys / "node1.key_secret", keys / "node2.key")
    assert "--server-key is not the public key of the recorder" in error, error
    assert said and "--server-key" in said[0]


@pytest.mark.system
def test_an_agent_with_nothing_listening_exits_1_in_bounded_time(keys, capsys):
    port = free_port()
    started = time.monotonic()
    code = main(["agent", "--connect", f"tcp://127.0.0.1:{port}", "--key",
                 str(keys / "node1.key_secret"), "--server-key", str(keys / "recorder.key"),
                 "--simulate", "--connect-timeout", "1"])
    assert code == 1
    assert time.monotonic() - started < 5.0
    err = capsys.readouterr().err
    assert f"nothing is listening at tcp://127.0.0.1:{port}" in err, err
    assert main(["agent", "--key", str(keys / "node1.key_secret"), "--server-key",
                 str(keys / "recorder.key"), "--simulate", "--connect-timeout", "0"]) == 2


@pytest.mark.system
def test_agent_refuses_bad_nvml_intervals_before_connecting(keys, capsys):
    assert main(["agent", "--connect", f"tcp://127.0.0.1:{free_port()}", "--key",
                 str(keys / "node1.key_secret"), "--server-key", str(keys / "recorder.key"),
                 "--simulate", "--nvml-intervals", "drain=9"]) == 2
    assert "drain=9 s is longer than 2.0 s" in capsys.readouterr().err


@pytest.mark.system
def test_record_listen_and_agent_commands_end_to_end(tmp_path, keys, spawn):
    """`wattlab record --listen ... --agent node1` waits for `wattlab agent`, then records."""
    out = tmp_path / "bench.h5"
    listen = f"tcp://127.0.0.1:{free_port()}"
    agent = spawn(
        [*WATTLAB, "agent", "--connect", listen, "--key", str(keys / "node1.key_secret"),
         "--server-key", str(keys / "recorder.key"), "--simulate", "--nvml-intervals",
         "drain=0.5"],
        env={**os.environ, SKEW_ENV: "5000000000:30"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    record = subprocess.run(
        [*WATTLAB, "record", "--nvml", "none", "--listen", listen, "--server-key",
         str(keys / "recorder.key_secret"), "--allow-keys", str(keys / "allowed"),
         "--agent", "node1", "--duration", "2", "-o", str(out)],
        capture_output=True, text=True, timeout=90, check=False)
    agent_out = agent.communicate(timeout=30)[0]
    assert record.returncode == 0, record.stderr
    assert agent.returncode == 0, agent_out
    assert "the recording ended" in agent_out
    with wattlab.open(str(out)) as run:
        assert {"node1.gpu0.samples", "node1.gpu0.power"} <= set(run.sources)
        samples = run.source("node1.gpu0.samples")
        assert np.ptp(samples.time_ns) / 1e9 > 1.5
        assert samples.descriptor["config"]["intervals_s"]["drain"] == 0.5
        session = [m for m in run.markers if m.name == "session"]
        begin = next(m.time_ns for m in session if m.kind == "begin")
        end = next(m.time_ns for m in session if m.kind == "end")
        # remote samples sit inside the session on the recorder's clock (not 5 s away)
        assert begin - 1e9 < np.median(samples.time_ns) < end
    with h5py.File(str(out)) as f:
        assert "node1" in f["sync"]


@pytest.mark.fast
def test_record_rejects_half_configured_listening(tmp_path, keys):
    assert main(["record", "--nvml", "none", "--agent", "node1", "--duration", "1",
                 "-o", str(tmp_path / "a.h5")]) == 2
    assert main(["record", "--simulate", "--listen", "--duration", "1",
                 "-o", str(tmp_path / "b.h5")]) == 2
    assert main(["record", "--simulate", "--listen", "--server-key",
                 str(keys / "recorder.key_secret"), "--allow-keys", str(keys / "allowed"),
                 "--agent", "stranger", "--duration", "1", "-o", str(tmp_path / "c.h5")]) == 2
