"""AMD GPUs through amdsmi: the driver on the fake amdsmi, wraps, plausibility, end to end."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import wattlab
from wattlab.acquisition.acquirers.nvml_acquirer import NvmlAcquirer
from wattlab.acquisition.session.supervisor import Session
from wattlab.analysis.energy.node_energy import format_node_report, node_report
from wattlab.cli import main
from wattlab.device_models.workload_schedule import WorkloadSchedule
from wattlab.drivers.amdsmi import AmdSmiDriver
from wattlab.errors import NvmlMissingError
from wattlab.hardware.fake_amdsmi import MI300A, MI300X, RESOLUTION_UJ, FakeAmdSmi
from wattlab.hardware.simulated_gpu import SimulatedGpu

WRAP_UNITS = 2**32


class Clock:
    """A hand-moved monotonic clock, so the simulated GPU's energy is known exactly."""

    def __init__(self) -> None:
        self.t_ns = 1_000_000_000

    def __call__(self) -> int:
        return self.t_ns


def gpus(count: int = 1, *, model=MI300X, util: float = 0.6, **kwargs) -> list[SimulatedGpu]:
    return [SimulatedGpu(index=i, seed=5 + i, model=model,
                         schedule=WorkloadSchedule.constant(util, 3600.0), **kwargs)
            for i in range(count)]


@pytest.mark.fast
def test_readings_in_si_units_and_what_is_missing():
    lib = FakeAmdSmi(gpus(2), unsupported={"average_socket_power"})
    with AmdSmiDriver(lib) as driver:
        assert driver.resolve_gpus("all") == [0, 1]
        info = driver.device_info(1)
        assert info.name == MI300X.name and info.uuid
        assert (info.power_limit_min_w, info.power_limit_max_w) == MI300X.power_limit_range_w
        assert max(info.sm_clocks_mhz) == 2100
        current_w, average_w = driver.read_power(0)
        assert average_w is None and 140 <= current_w <= 1100
        state = driver.read_state(0)
        assert state["sm_clock_hz"] == pytest.approx(2.1e9, rel=0.5)
        assert state["power_limit_w"] == 750.0 and 0 <= state["gpu_util_pct"] <= 100
        missing = driver.probe(0)
        assert set(missing) == {"samples_power_w", "average_power_w"}
        assert driver.read_samples(0, 0)[0].shape == (0,)
    assert not lib.initialised  # shut down when the last user closed


@pytest.mark.fast
def test_a_32_bit_wrap_is_unwrapped_exactly():
    clock = Clock()
    (gpu,) = gpus(clock_ns=clock)
    start = WRAP_UNITS - 1000
    lib = FakeAmdSmi([gpu], counter_bits=32, start_units=start)
    with AmdSmiDriver(lib) as driver:
        first_j = driver.read_energy_j(0)
        t0 = clock.t_ns
        raws, energies = [], []
        for _ in range(5):
            clock.t_ns += 200_000_000
            energies.append(driver.read_energy_j(0))
            raws.append(lib.amdsmi_get_energy_count(driver.handle(0))["energy_accumulator"])
        true_j = gpu.true_energy_j(t0, clock.t_ns)
    assert raws[0] < start  # the accumulator really wrapped
    assert driver.wraps_seen == 1
    assert np.all(np.diff(energies) > 0)
    assert energies[-1] - first_j == pytest.approx(true_j, abs=2 * RESOLUTION_UJ * 1e-6)


def record(tmp_path, lib: FakeAmdSmi, count: int = 1, seconds: float = 2.5,
           **intervals) -> str:
    driver = AmdSmiDriver(lib)
    acquirers = [(f"amd{i}", NvmlAcquirer(driver, i, intervals_s=intervals or None))
                 for i in range(count)]
    out = str(tmp_path / "amd.h5")
    Session(out, acquirers, duration_s=seconds).run()
    return out


@pytest.mark.system
def test_streams_recorded_end_to_end_and_counted_by_the_node_report(tmp_path):
    (gpu,) = gpus()
    lib = FakeAmdSmi([gpu], counter_bits=32, start_units=WRAP_UNITS - 20_000_000)
    out = record(tmp_path, lib, energy=0.3)
    with wattlab.open(out) as run:
        assert {"amd0.power", "amd0.energy", "amd0.state"} <= set(run.sources)
        assert "amd0.samples" not in run.sources  # amdsmi has no sample buffer
        energy = run.source("amd0.energy")
        assert energy.kind == "amdsmi"
        config = energy.descriptor["config"]
        assert config["scope"]["measures"] == "the whole GPU board"
        assert config["energy_counter"]["resolution_uj"] == RESOLUTION_UJ
        assert any("32 bits" in c for c in config["caveats"])
        e_j = energy.channel("energy_j")
        t_ns = energy.time_ns + int(run.attrs["session_start_monotonic_ns"])
        report = node_report(run)
        text = format_node_report(report)
    assert np.all(np.diff(e_j) > 0), "the wrap must not show as a drop"
    assert len(e_j) >= 6
    true_j = gpu.true_energy_j(int(t_ns[0]), int(t_ns[-1]))
    assert e_j[-1] - e_j[0] == pytest.approx(true_j, rel=0.002)
    (node,) = report["nodes"]
    (part,) = node["parts"]
    assert part["part"] == "amd0" and part["streams"] == ["amd0.energy:energy_j"]
    assert "amdsmi_get_energy_count" in part["how"]
    assert not report["notes"], report["notes"]  # a sound counter raises no warning
    assert "implausible" not in text


@pytest.mark.system
def test_an_implausible_counter_is_flagged(tmp_path):
    lib = FakeAmdSmi(gpus(), counter_scale=0.6)  # counts 60 % of the joules
    out = record(tmp_path, lib, energy=0.5)
    with wattlab.open(out) as run:
        report = node_report(run)
    (note,) = report["notes"]
    assert note.startswith("this host amd0: the energy counter says")
    assert "implausible" in note and "amd0.power:average_power_w" in note
    assert "-40" in note or "-39" in note or "-41" in note


@pytest.mark.fast
def test_an_apu_is_a_module_whose_socket_power_covers_the_cpu():
    driver = AmdSmiDriver(FakeAmdSmi(gpus(model=MI300A)))
    acquirer = NvmlAcquirer(driver, 0)
    try:
        scope = acquirer.open()[0].config["scope"]
    finally:
        acquirer.close()
    assert scope["covers"] == ["cpu", "gpu", "memory"]
    assert "APU socket: CPU cores, GPU and HBM" in scope["measures"]


@pytest.mark.fast
def test_without_amdsmi_the_error_says_how_to_get_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi raises ImportError
    with pytest.raises(NvmlMissingError, match="pip install amdsmi; needs ROCm's libamd_smi"):
        AmdSmiDriver().open()
    assert main(["record", "--amd", "all", "--duration", "1", "-o",
                 str(tmp_path / "x.h5")]) == 2
    assert "pip install amdsmi; needs ROCm's libamd_smi" in capsys.readouterr().err


@pytest.mark.fast
@pytest.mark.parametrize(("spec", "says"), [("0,x", "is not valid"),
                                            ("3", "GPU index 3 not found")])
def test_a_bad_amd_list_is_a_usage_error(spec, says, capsys, tmp_path):
    assert main(["record", "--amd", spec, "--simulate", "--duration", "1", "-o",
                 str(tmp_path / "x.h5")]) == 2
    err = capsys.readouterr().err
    assert f"--amd {spec}" in err and says in err
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.system
def test_record_amd_simulate_through_the_cli_and_a_bench_file(tmp_path, capsys):
    out = tmp_path / "cli.h5"
    assert main(["record", "--amd", "all", "--simulate", "--simulated-gpus", "2",
                 "--duration", "1.5", "-o", str(out), "--no-live"]) == 0
    with wattlab.open(str(out)) as run:
        ids = set(run.sources)
    assert {"amd0.power", "amd1.energy", "amd1.state"} <= ids
    assert not any(i.startswith("gpu") for i in ids)  # --amd: --nvml defaults to none
    bench = tmp_path / "bench.toml"
    bench.write_text('[[device]]\nkind = "amd"\nid = "mi"\nindex = "0"\nsimulate = true\n'
                     'streams = "power,energy"\n')
    out2 = tmp_path / "bench.h5"
    assert main(["record", "--bench", str(bench), "--duration", "1.5", "-o", str(out2),
                 "--no-live"]) == 0
    capsys.readouterr()
    assert main(["energy", str(out2), "--node", "--json"]) == 0
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    assert [p["streams"] for p in node["parts"]] == [["mi.energy:energy_j"]]
