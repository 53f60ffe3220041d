"""`--prometheus`: real recordings scraped over HTTP, and by a real Prometheus server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from typing import Any

import numpy as np
import pytest

import wattlab
from tests.conftest import free_port
from tests.test_agent import SKEW_ENV
from wattlab.analysis.energy.source_energy import energy_report
from wattlab.cli import main

parser = pytest.importorskip("prometheus_client.parser",
                             reason="prometheus-client is not installed (the prometheus extra)")

WATTLAB = [sys.executable, "-m", "wattlab.cli"]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of the endpoint, parsed as Prometheus parses the text format."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def pick(samples: Samples, name: str, **labels: str) -> float:
    found = [v for (n, ls), v in samples.items()
             if n == name and labels.items() <= dict(ls).items()]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def scrape_while(proc: subprocess.Popen[Any], url: str, every_s: float = 0.3) -> list[Samples]:
    """Scrape until the process ends (connection refused before it listens, and after)."""
    got: list[Samples] = []
    while proc.poll() is None:
        with contextlib.suppress(OSError):
            got.append(scrape(url))
        time.sleep(every_s)
    return got


def scrape_pairs_while(proc: subprocess.Popen[Any], first_url: str, then_url: str,
                       every_s: float = 0.3) -> list[tuple[Samples, Samples]]:
    """Scrape ``first_url`` then ``then_url`` until the process ends; the rounds in which
    both answered. Why pairs in that order: a count compared across two endpoints is only
    ordered for scrapes whose order is known; the last scrape of each, taken apart (one
    refused or timed out under load), may be seconds apart either way."""
    got: list[tuple[Samples, Samples]] = []
    while proc.poll() is None:
        with contextlib.suppress(OSError):
            first = scrape(first_url)
            got.append((first, scrape(then_url)))
        time.sleep(every_s)
    return got


def has_stream(samples: Samples, source: str) -> bool:
    return any(dict(labels).get("source") == source for _, labels in samples)


def window_energy_j(path: str, source: str, channel: str, last_unix_s: float) -> tuple[
        float, int]:
    """`wattlab energy` over the stream's samples up to a wall time, and how many they are."""
    with wattlab.open(path) as run:
        view = run.source(source)
        t_ns = view.time_ns
        start_unix_ns = int(run.attrs["session_start_unix_ns"])
        t1_s = (last_unix_s * 1e9 - start_unix_ns) / 1e9
        rows = int(np.searchsorted(t_ns, t1_s * 1e9 + 1e6))  # within 1 ms of that time
        report = energy_report(run, by_marker=False, windows=[(t_ns[0] / 1e9, t1_s)])
    row = next(r for r in report["rows"] if r["phase"] == "window"
               and (r["source"], r["channel"]) == (source, channel))
    return float(row["energy_j"]), rows


@pytest.mark.system
def test_a_recording_scraped_over_http_agrees_with_wattlab_energy(tmp_path, spawn):
    out = tmp_path / "run.h5"
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = spawn([*WATTLAB, "record", "--simulate", "--duration", "5", "-o", str(out),
                  "--nvml-streams", "samples,power,state", "--prometheus", str(port)],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scrapes = scrape_while(proc, url)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"Prometheus metrics at {url}" in err  # a bare port binds loopback
    # before the streams are announced the endpoint answers with no stream yet
    scrapes = [s for s in scrapes if any(dict(k[1]).get("source") == "gpu0.samples"
                                         for k in s)]
    assert len(scrapes) >= 5
    energies = [pick(s, "wattlab_energy_joules_total", source="gpu0.samples",
                     channel="power_w") for s in scrapes]
    assert np.all(np.diff(energies) >= 0) and energies[-1] > 1000  # a counter: monotonic
    last = scrapes[-1]
    last_unix_s = pick(last, "wattlab_last_sample_timestamp_seconds", source="gpu0.samples")
    energy_j, rows = window_energy_j(str(out), "gpu0.samples", "power_w", last_unix_s)
    assert pick(last, "wattlab_energy_joules_total", source="gpu0.samples",
                channel="power_w") == pytest.approx(energy_j, rel=0.01)
    assert pick(last, "wattlab_samples_total", source="gpu0.samples") == rows
    assert pick(last, "wattlab_gaps_total", source="gpu0.samples") == 0
    # every W channel of the power stream, the state stream's limit is no draw
    assert 0 < pick(last, "wattlab_power_watts", source="gpu0.power",
                    channel="average_power_w") < 1000
    assert not [k for k in last if k[0] == "wattlab_power_watts" and
                dict(k[1])["source"] == "gpu0.state"]
    info = pick(last, "wattlab_info", source="gpu0.samples", kind="nvml",
                model="Simulated H100 80GB HBM3")
    assert info == 1
    assert dict(next(k[1] for k in last if k[0] == "wattlab_info"))["driver"]


@pytest.mark.system
def test_gaps_count_as_the_file_records_them(tmp_path, spawn):
    """A source killed mid-run (its own process) leaves a gap the counter shows."""
    out = tmp_path / "gap.h5"
    port = free_port()
    proc = spawn([*WATTLAB, "record", "--simulate", "--duration", "6", "-o", str(out),
                  "--nvml-streams", "samples", "--source-processes", "--prometheus",
                  f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if pick(scrape(url), "wattlab_samples_total", source="gpu0.samples") > 50:
                break
        except (OSError, AssertionError):
            pass
        time.sleep(0.2)
    kids = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "source_child"],
                          capture_output=True, text=True, check=False).stdout.split()
    assert kids, "no source process found"
    os.kill(int(kids[0]), 9)
    scrapes = scrape_while(proc, url)
    proc.communicate(timeout=60)
    with wattlab.open(str(out)) as run:
        in_file = sum(g.source == "gpu0.samples" for g in run.gaps)
    assert in_file >= 1
    assert pick(scrapes[-1], "wattlab_gaps_total", source="gpu0.samples") == in_file


@pytest.mark.system
def test_agent_and_recorder_expose_streams_and_the_clock_offset(tmp_path, keys, spawn):
    """The agent serves its own streams; the recorder adds the agent host's clock offset."""
    out = tmp_path / "bench.h5"
    listen = f"tcp://127.0.0.1:{free_port()}"
    agent_port, rec_port = free_port(), free_port()
    agent = spawn(
        [*WATTLAB, "agent", "--connect", listen, "--key", str(keys / "node1.key_secret"),
         "--server-key", str(keys / "recorder.key"), "--simulate", "--nvml-streams", "samples",
         "--prometheus", f"127.0.0.1:{agent_port}"],
        env={**os.environ, SKEW_ENV: "5000000000:0"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    record = spawn(
        [*WATTLAB, "record", "--nvml", "none", "--listen", listen, "--server-key",
         str(keys / "recorder.key_secret"), "--allow-keys", str(keys / "allowed"),
         "--agent", "node1", "--duration", "4", "-o", str(out), "--prometheus",
         f"127.0.0.1:{rec_port}"], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pairs = scrape_pairs_while(record, f"http://127.0.0.1:{rec_port}/metrics",
                               f"http://127.0.0.1:{agent_port}/metrics")
    _, record_err = record.communicate(timeout=60)
    assert record.returncode == 0, record_err
    agent_out = agent.communicate(timeout=30)[0]
    assert agent.returncode == 0, agent_out
    assert "Prometheus metrics at" in agent_out
    on_recorder, on_agent = [p for p in pairs if all(
        has_stream(s, "node1.gpu0.samples") for s in p)][-1]
    assert pick(on_agent, "wattlab_samples_total", source="node1.gpu0.samples") > 50
    assert pick(on_agent, "wattlab_power_watts", source="node1.gpu0.samples",
                channel="power_w") > 0
    assert pick(on_recorder, "wattlab_samples_total", source="node1.gpu0.samples") > 50
    # the agent's clock runs 5 s ahead (simulated): the recorder's mapping says so
    assert pick(on_recorder, "wattlab_clock_offset_seconds", host="node1") == pytest.approx(
        5.0, abs=1e-3)
    # both saw the same samples: their energies agree. The agent counts a batch before it
    # sends it and the recorder was scraped first, so the agent may be batches ahead, never
    # behind (0.1 % for the order of the sums)
    agent_j = pick(on_agent, "wattlab_energy_joules_total", source="node1.gpu0.samples")
    rec_j = pick(on_recorder, "wattlab_energy_joules_total", source="node1.gpu0.samples")
    assert 0 < rec_j <= agent_j * 1.001
    assert pick(on_recorder, "wattlab_samples_total", source="node1.gpu0.samples") <= pick(
        on_agent, "wattlab_samples_total", source="node1.gpu0.samples")


@pytest.mark.fast
@pytest.mark.parametrize(("address", "message"), [
    ("127.0.0.1:http", "expected HOST:PORT"),
    ("70000", "port from 0 to 65535"),
])
def test_bad_addresses_are_usage_errors(tmp_path, capsys, address, message):
    assert main(["record", "--simulate", "--duration", "1", "-o", str(tmp_path / "x.h5"),
                 "--prometheus", address]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.system
def test_a_taken_port_is_refused_before_recording(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["record", "--simulate", "--duration", "1", "-o", str(tmp_path / "x.h5"),
                     "--prometheus", f"127.0.0.1:{port}"]) == 2
    assert "cannot listen there" in capsys.readouterr().err
    assert not (tmp_path / "x.h5").exists()


PROMETHEUS = shutil.which("prometheus")


def promql(base: str, query: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.system
@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus server binary is not installed "
                    "(Debian: apt-get install prometheus)")
def test_a_real_prometheus_scrapes_a_recording_and_promql_gives_its_energy(tmp_path, spawn):
    rec_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: wattlab\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{rec_port}']\n")
    base = f"http://127.0.0.1:{prom_port}"
    server = spawn(
        [str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "no prometheus"
                time.sleep(0.2)
        out = tmp_path / "run.h5"
        record = subprocess.run(
            [*WATTLAB, "record", "--simulate", "--duration", "8", "-o", str(out),
             "--nvml-streams", "samples", "--prometheus", f"127.0.0.1:{rec_port}"],
            capture_output=True, text=True, timeout=90, check=False)
        assert record.returncode == 0, record.stderr
        selector = '{job="wattlab",source="gpu0.samples",channel="power_w"}'
        energy = promql(base, f"last_over_time(wattlab_energy_joules_total{selector}[10m])")
        stamp = promql(base, 'last_over_time(wattlab_last_sample_timestamp_seconds'
                       '{job="wattlab",source="gpu0.samples"}[10m])')
        increase = promql(base, f"increase(wattlab_energy_joules_total{selector}[10m])")
    finally:
        server.terminate()
        server.wait(30)
    assert len(energy) == 1 and len(stamp) == 1 and len(increase) == 1
    prom_j = float(energy[0]["value"][1])
    file_j, _ = window_energy_j(str(out), "gpu0.samples", "power_w",
                                float(stamp[0]["value"][1]))
    assert prom_j == pytest.approx(file_j, rel=0.01)
    assert float(increase[0]["value"][1]) > 0.5 * prom_j  # PromQL's own counter arithmetic
