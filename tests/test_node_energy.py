"""What each GPU stream measures, honest fallbacks, and a node report adding each joule once."""

from __future__ import annotations

import numpy as np
import pynvml
import pytest

import wattlab
from tests.conftest import free_port
from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.acquirers.nvml_acquirer import NvmlAcquirer
from wattlab.acquisition.acquirers.rapl_acquirer import RaplAcquirer
from wattlab.acquisition.session.supervisor import Session
from wattlab.analysis.energy.node_energy import format_node_report, node_report
from wattlab.analysis.energy.source_energy import energy_report
from wattlab.cli import main
from wattlab.device_models.workload_schedule import WorkloadSchedule
from wattlab.drivers.nvml import NvmlDriver
from wattlab.hardware.emulators.powercap_emulator import PowercapEmulator, Zone, intel_server
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu
from wattlab.runfile.reader import Run
from wattlab.runfile.writer import RunFileWriter

PRE_VOLTA = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetMigMode",
             "NVML_FI_DEV_POWER_INSTANT")
CASES = {  # name: SimulatedGpu keywords
    "plain": {},
    "pre_volta": {"unsupported": PRE_VOLTA},
    "mig": {"mig": True},
    "vgpu": {"virtualization_mode": pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU},
    "gh200": {"module_power": True, "model": GpuModel(name="NVIDIA GH200 480GB")},
}


def gpu(case: str, index: int = 0, seed: int = 3) -> SimulatedGpu:
    return SimulatedGpu(index=index, seed=seed + index,
                        schedule=WorkloadSchedule.constant(0.6, 3600.0), **CASES[case])


def descriptors_of(case: str) -> dict[str, dict]:
    acquirer = NvmlAcquirer(NvmlDriver(FakeNvml([gpu(case)])), 0)
    try:
        return {d.source_id: d.config for d in acquirer.open()}
    finally:
        acquirer.close()


@pytest.mark.fast
@pytest.mark.parametrize(("case", "covers", "says", "energy"), [
    ("plain", ["gpu"], "the whole GPU board", "counter: gpu0.energy:energy_j"),
    ("pre_volta", ["gpu"], "the whole GPU board",
     "integrated: gpu0.samples:power_w, because nvmlDeviceGetTotalEnergyConsumption is not "
     "supported"),
    ("mig", ["gpu"], "never one instance", "counter"),
    ("vgpu", ["gpu"], "shared with other virtual machines", "counter"),
    ("gh200", ["cpu", "gpu", "memory"], "Grace CPU, GPU and memory", "counter"),
])
def test_each_case_is_detected_and_described(case, covers, says, energy):
    configs = descriptors_of(case)
    config = configs["gpu0.samples"]
    assert config["scope"]["covers"] == covers
    assert says in config["scope"]["measures"]
    assert config["energy_source"].startswith(energy)
    assert ("gpu0.energy" in configs) == (case != "pre_volta")  # never a 0 J stream
    assert config["scope"]["mig"] == (case == "mig")


def record(tmp_path, gpus, *, rapl: list[Zone] | None = None,
           seconds: float = 2.0) -> tuple[str, PowercapEmulator | None]:
    """Record the GPUs (and RAPL zones) for ``seconds``; the file and the stopped emulator."""
    driver = NvmlDriver(FakeNvml(gpus))
    acquirers = [(f"gpu{g.index}", NvmlAcquirer(driver, g.index)) for g in gpus]
    emulator = None
    if rapl is not None:
        emulator = PowercapEmulator(tmp_path / "powercap", rapl).start()
        acquirers.append(("rapl", RaplAcquirer(str(tmp_path / "powercap"))))
    out = str(tmp_path / "run.h5")
    try:
        Session(out, acquirers, duration_s=seconds).run()
    finally:
        if emulator is not None:
            emulator.stop()
    return out, emulator


def true_power_scale(run: Run, emulator: PowercapEmulator, stream: str, channel: str,
                     zone: str, span_s: tuple[float, float]) -> float:
    """The emulator's seconds per second of the reader's clock over ``span_s`` for one zone.

    Each value the reader stored is found in the emulator's own log of what it wrote when;
    as the report interpolates the counter between reads at the span's edges (clipped to the
    reads), so is its write time. A constant-power zone's true power times this is the rate
    the report must show, however far the writer thread lagged the reads.
    """
    view = run.source(stream)
    first_uj = view.descriptor["config"]["zones"][channel]["first_energy_uj"]
    units = first_uj + np.rint(view.channel(channel) * 1e6).astype(np.int64)
    written_ns = {counted[zone]: t for t, counted in emulator.log}
    t_s = view.time_s
    edges = np.clip(span_s, t_s[0], t_s[-1])
    w0, w1 = np.interp(edges, t_s, [written_ns[int(u)] for u in units])
    return float(w1 - w0) / 1e9 / float(edges[1] - edges[0])


@pytest.mark.system
def test_node_report_adds_gpus_cpu_and_dram_once_and_falls_back_with_a_reason(tmp_path):
    out, emulator = record(
        tmp_path, [gpu("plain", 0), gpu("pre_volta", 1)],
        rapl=[Zone("intel-rapl:0", "package-0", [(1.0, 100.0)],
                   children=[Zone("intel-rapl:0:0", "core", [(1.0, 60.0)]),
                             Zone("intel-rapl:0:1", "dram", [(1.0, 15.0)])])])
    assert emulator is not None
    with wattlab.open(out) as run:
        report = node_report(run)
        text = format_node_report(report)
        span = report["span_s"][0], report["span_s"][1]
        lag = {part: true_power_scale(run, emulator, "rapl.package-0", channel, zone, span)
               for part, channel, zone in (
                   ("cpu", "package_energy_j", "intel-rapl:0"),
                   ("dram", "dram_energy_j", "intel-rapl:0/intel-rapl:0:1"))}
    (node,) = report["nodes"]
    parts = {p["part"]: p for p in node["parts"]}
    assert set(parts) == {"gpu0", "gpu1", "cpu", "dram"}  # core is part of the package
    assert parts["gpu0"]["streams"] == ["gpu0.energy:energy_j"]
    assert parts["gpu1"]["streams"] == ["gpu1.samples:power_w"]
    assert "not supported" in parts["gpu1"]["how"] and parts["gpu1"]["energy_j"] > 100
    seconds = report["span_s"][1] - report["span_s"][0]
    # The emulator's writer thread can lag the reads by tens of ms under load (a CI run read
    # DRAM at 14.35 W for 15), so the expected rate is the zone's power timed by the
    # emulator's own log (true_power_scale), not the wall clock; rel 1e-6: the counter shows
    # whole µJ (under 1e-7 of the ≥ 15 J counted). Core added to the CPU would read 160 W.
    assert parts["cpu"]["streams"] == ["rapl.package-0:package_energy_j"]
    assert parts["dram"]["streams"] == ["rapl.package-0:dram_energy_j"]
    assert parts["cpu"]["energy_j"] / seconds == pytest.approx(100.0 * lag["cpu"], rel=1e-6)
    assert parts["dram"]["energy_j"] / seconds == pytest.approx(15.0 * lag["dram"], rel=1e-6)
    total = sum(parts[k]["energy_j"] for k in ("gpu0", "gpu1", "cpu", "dram"))
    assert node["measured_j"] == pytest.approx(total)
    assert node["unmeasured"] is None and "no wall meter" in node["missing"][0]
    assert "core" not in text and "no wall meter" in text


def record_stepped(tmp_path, zones: list[Zone], late_ms: list[float], flush_ms: float) -> str:
    """RAPL alone on an injected clock: one poll per entry of ``late_ms``, each woken that
    many ms after it was due (a loaded host), then the flush ``flush_ms`` after the last.

    The emulator writes at every read's clock time, so each zone's power is exactly its
    profile's: no writer lag to correct for.
    """
    now = [1_000_000_000]
    emulator = PowercapEmulator(tmp_path / "powercap", zones, clock_ns=lambda: now[0])
    wakes = iter(late_ms)

    def sleep(due_ns: int, step_s: float) -> bool:
        now[0] = max(now[0], due_ns) + round(next(wakes) * 1e6)
        emulator.update()
        return True

    rapl = RaplAcquirer(str(tmp_path / "powercap"), clock_ns=lambda: now[0], sleep=sleep)
    descriptors = rapl.open()
    readings = [r for _ in late_ms for r in rapl.poll()]
    now[0] += round(flush_ms * 1e6)
    emulator.update()
    readings += rapl.flush()
    out = str(tmp_path / "run.h5")
    writer = RunFileWriter(out, {}, 1_000_000_000)
    for d in descriptors:
        writer.add_source(d)
    for r in readings:
        assert isinstance(r, Chunk)
        writer.append(r.source_id, r.t_host_ns, r.t_host_ns, r.values,
                      np.zeros(r.t_host_ns.size, np.uint8))
    writer.close()
    return out


# a loaded host: wake-ups a few ms late, two 40 and 70 ms late (reads 60 and 52 ms apart)
LOADED_MS = [0, 3, 1, 0, 2, 40, 0, 1, 0, 1, 4, 0, 70, 2, 0, 1, 0, 0, 3, 0]


@pytest.mark.fast
@pytest.mark.parametrize(("late_ms", "flush_ms"), [
    ([0] * 20, 1.0), ([0] * 20, 30.0), (LOADED_MS, 0.0)],
    ids=["flush-1ms-after", "flush-30ms-after", "late-reads"])
def test_rapl_power_is_exact_however_irregular_the_reads(tmp_path, late_ms, flush_ms):
    """Reads under 100 ms apart (the flush a few ms after the last poll, with the counter
    moved between them; reads after late ones) used to pin NVML's 100 ms update grid on
    the RAPL reads, moving each back by up to 0.1 s: a 100 W zone read as 95 W over 2 s."""
    out = record_stepped(tmp_path, [Zone("intel-rapl:0", "package-0", [(1.0, 100.0)],
                                         children=[Zone("intel-rapl:0:0", "dram",
                                                        [(1.0, 15.0)])])], late_ms, flush_ms)
    with wattlab.open(out) as run:
        report = node_report(run)
    parts = {p["part"]: p for p in report["nodes"][0]["parts"]}
    seconds = report["span_s"][1] - report["span_s"][0]
    # energy_uj truncates to whole µJ, so a difference of two reads is off by under 1 µJ;
    # 1 nJ more for float rounding (the emulator's µJ, the report's J: ~1e-8 µJ)
    assert parts["cpu"]["energy_j"] == pytest.approx(100.0 * seconds, abs=1e-6 + 1e-9)
    assert parts["dram"]["energy_j"] == pytest.approx(15.0 * seconds, abs=1e-6 + 1e-9)


@pytest.mark.fast
def test_the_energy_report_gives_a_rapl_zones_power_exactly_too(tmp_path):
    out = record_stepped(tmp_path, [Zone("intel-rapl:0", "package-0", [(1.0, 100.0)])],
                         [0] * 20, 1.0)
    with wattlab.open(out) as run:
        row = next(r for r in energy_report(run, by_marker=False)["rows"]
                   if r["channel"] == "package_energy_j" and r["phase"] == "run")
    # as above: under 1 µJ of truncation, 1 nJ of float rounding
    assert row["energy_j"] == pytest.approx(100.0 * (row["t1_s"] - row["t0_s"]),
                                            abs=1e-6 + 1e-9)


@pytest.mark.system
def test_a_module_counter_is_not_added_to_the_cpu_again(tmp_path):
    out, _ = record(tmp_path, [gpu("gh200", 0)], rapl=intel_server(packages=1))
    with wattlab.open(out) as run:
        (node,) = node_report(run)["nodes"]
    parts = {p["part"]: p for p in node["parts"]}
    assert parts["module0"]["added"] and not parts["cpu"]["added"]
    assert "already cover the CPU" in parts["cpu"]["how"]
    assert node["measured_j"] == pytest.approx(parts["module0"]["energy_j"] + 0.0)


@pytest.mark.fast
def test_wall_and_unmeasured_through_the_cli(demo_run, capsys):
    assert main(["energy", str(demo_run), "--node", "--json"]) == 0
    import json

    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    wall = next(p for p in node["parts"] if p["part"] == "wall")
    assert node["unmeasured"]["energy_j"] == pytest.approx(wall["energy_j"] - node["measured_j"])
    assert 0 < node["unmeasured"]["energy_j"] < wall["energy_j"]
    assert main(["energy", str(demo_run), "--wall", "wall"]) == 2  # --wall needs --node


@pytest.mark.system
def test_a_job_over_three_nodes_through_agents_counts_each_node_once(tmp_path, capsys, spawn):
    """One recorder node and two agent nodes (simulated GPUs): each node's share and one
    job total equal to the sum of the nodes' own GPU counters."""
    import json
    import subprocess
    import sys

    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    assert main(["keys", "recorder", "n1", "n2", "-d", str(keys)]) == 0
    allowed.mkdir()
    for name in ("n1", "n2"):
        (allowed / f"{name}.key").write_bytes((keys / f"{name}.key").read_bytes())
    endpoint, out = f"tcp://127.0.0.1:{free_port()}", tmp_path / "job.h5"
    cli = [sys.executable, "-m", "wattlab.cli"]
    recorder = spawn(
        [*cli, "record", "--listen", endpoint, "--server-key", str(keys / "recorder.key_secret"),
         "--allow-keys", str(allowed), "--agent", "n1", "--agent", "n2", "--simulate",
         "--duration", "4", "--no-live", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    agents = [spawn(
        [*cli, "agent", "--connect", endpoint, "--key", str(keys / f"{name}.key_secret"),
         "--server-key", str(keys / "recorder.key"), "--simulate", "--seed", str(seed)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for seed, name in enumerate(("n1", "n2"), start=1)]
    _, err = recorder.communicate(timeout=90)
    assert recorder.returncode == 0, err
    for agent in agents:
        _, agent_err = agent.communicate(timeout=30)
        assert agent.returncode == 0, agent_err
    capsys.readouterr()
    assert main(["energy", str(out), "--node", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    nodes = {n["node"]: n for n in report["nodes"]}
    assert len(nodes) == 3 and {"n1", "n2"} <= set(nodes)
    assert report["job_measured_j"] == pytest.approx(sum(n["measured_j"] for n in nodes.values()))
    assert sum(n["share_pct"] for n in nodes.values()) == pytest.approx(100.0)
    assert main(["energy", str(out), "--json"]) == 0
    rows = {r["source"]: r["energy_j"] for r in json.loads(capsys.readouterr().out)["rows"]
            if r["phase"] == "run" and r["channel"] == "energy_j"}
    for name, node in nodes.items():
        gpus = [p for p in node["parts"] if p["part"].startswith("gpu")]
        assert len(gpus) == 1, gpus  # one simulated GPU a node, counted once
        stream = f"{name}.gpu0.energy" if name in ("n1", "n2") else "gpu0.energy"
        assert gpus[0]["energy_j"] == pytest.approx(rows[stream], rel=1e-9), (name, gpus, rows)
        assert node["measured_j"] == pytest.approx(gpus[0]["energy_j"], rel=1e-9)
