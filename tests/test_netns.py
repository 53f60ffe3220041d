"""Recorder and agent on two network namespaces joined by a veth pair: real addresses.

Needs root (``ip netns add``); skipped with the reason otherwise. Each namespace is new and
private (its own addresses and ports), so the fixed port cannot collide with anything; the
names of the namespaces and veth links are global, so they carry this process's whole pid.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.test_agent import GOAL_MEDIAN_NS, GOAL_P99_NS, truth_error_ns
from wattlab.acquisition.session.agent import SKEW_ENV, ClockSkew
from wattlab.cli import main

pytestmark = pytest.mark.system

RECORDER_ADDR = "10.213.7.1"
AGENT_ADDR = "10.213.7.2"
PORT = 5560


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) is not installed")
    tag = f"wl{os.getpid()}"  # a link name is at most 15 bytes: wl + 7 digits + a/b
    rec, agt = f"{tag}rec", f"{tag}agt"
    made = _ip("netns", "add", rec)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace (needs root): {made.stderr.strip()}")
    try:
        steps = [
            ("netns", "add", agt),
            ("link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b"),
            ("link", "set", f"{tag}a", "netns", rec),
            ("link", "set", f"{tag}b", "netns", agt),
            ("-n", rec, "addr", "add", f"{RECORDER_ADDR}/24", "dev", f"{tag}a"),
            ("-n", agt, "addr", "add", f"{AGENT_ADDR}/24", "dev", f"{tag}b"),
            ("-n", rec, "link", "set", f"{tag}a", "up"),
            ("-n", agt, "link", "set", f"{tag}b", "up"),
            ("-n", rec, "link", "set", "lo", "up"),
            ("-n", agt, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"ip {' '.join(step)} failed: {done.stderr.strip()}")
        yield rec, agt
    finally:
        _ip("netns", "del", rec)
        _ip("netns", "del", agt)


def test_agent_in_another_namespace_records_on_the_recorder_clock(namespaces, tmp_path, spawn):
    rec_ns, agent_ns = namespaces
    keys = tmp_path / "keys"
    assert main(["keys", "recorder", "node1", "-d", str(keys)]) == 0
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "node1.key").write_bytes((keys / "node1.key").read_bytes())
    out = tmp_path / "netns.h5"
    skew = ClockSkew(-7_000_000_000, 60.0)
    repo = Path(__file__).resolve().parents[1]
    code = "from tests.test_agent import agent_main; agent_main()"
    agent = spawn(
        ["ip", "netns", "exec", agent_ns, sys.executable, "-c", code,
         f"tcp://{RECORDER_ADDR}:{PORT}", str(keys / "node1.key_secret"),
         str(keys / "recorder.key")],
        cwd=repo, env={**os.environ, SKEW_ENV: f"{skew.offset_ns}:{skew.drift_ppm}"},
        text=True, stderr=subprocess.PIPE)
    record = subprocess.run(
        ["ip", "netns", "exec", rec_ns, sys.executable, "-m", "wattlab.cli", "record",
         "--nvml", "none", "--listen", f"tcp://{RECORDER_ADDR}:{PORT}",
         "--server-key", str(keys / "recorder.key_secret"), "--allow-keys", str(allowed),
         "--agent", "node1", "--duration", "3", "-o", str(out)],
        capture_output=True, text=True, timeout=90, check=False)
    agent_err = agent.communicate(timeout=30)[1]
    assert record.returncode == 0, record.stderr
    assert agent.returncode == 0, agent_err
    err = np.abs(truth_error_ns(str(out), "node1.ramp", skew))
    assert err.size > 3000
    assert np.median(err) < GOAL_MEDIAN_NS and np.percentile(err, 99) < GOAL_P99_NS
    with h5py.File(out) as f:
        assert f["sync/node1"].attrs["rtt_min_ns"] > 0
