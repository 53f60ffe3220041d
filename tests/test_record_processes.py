"""Recordings with the per-process stream: `record --simulate --shared-processes`,
`demo --shared`, and a GPU that refuses the per-process query (docs/processes.md)."""

from __future__ import annotations

import json

import pynvml
import pytest

import wattlab
from tests.test_cli import run_cli
from wattlab.acquisition.acquirers import NvmlAcquirer
from wattlab.acquisition.session import Session
from wattlab.commands.record import report, unread_processes
from wattlab.drivers.nvml import NvmlDriver
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import simulated_gpus


@pytest.mark.system
def test_record_simulate_shared_processes_writes_rows_identities_and_truth(tmp_path):
    out = tmp_path / "shared.h5"
    done = run_cli("record", "--simulate", "--shared-processes", "2", "--duration", "7",
                   "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "gpu0.processes" in done.stdout and "no per-process stream" not in done.stderr
    with wattlab.open(str(out)) as run:
        rows = run.source("gpu0.processes").to_pandas()
        markers = run.markers
    assert set(rows["pid"].astype(int)) <= {4100, 4137} and len(rows) > 5
    identities = [m for m in markers if m.name == "process"]
    assert {m.payload["comm"] for m in identities} <= {"sim-matmul", "sim-copy"}
    assert identities and all(m.source == "gpu0.processes" for m in identities)
    (truth,) = [m for m in markers if m.name == "simulated-truth"]
    assert set(truth.payload["dynamic_j"]) == {"4100", "4137"}
    assert truth.payload["idle_j"] > 0


@pytest.mark.system
def test_shared_processes_need_the_simulated_gpu(tmp_path):
    done = run_cli("record", "--shared-processes", "2", "--duration", "1",
                   "-o", str(tmp_path / "x.h5"))
    assert done.returncode == 2 and "--shared-processes needs --simulate" in done.stderr


@pytest.mark.system
def test_demo_shared_says_where_the_run_and_its_truth_are(tmp_path):
    out = tmp_path / "demo.h5"
    done = run_cli("demo", "--shared", "--processes", "2", "--duration", "4", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout and "simulated-truth" in done.stdout
    with wattlab.open(str(out)) as run:
        assert len(run.source("gpu0.processes").to_pandas()) > 0


@pytest.mark.system
def test_a_refusing_gpu_records_everything_else_and_record_says_why_once(tmp_path, capsys):
    lib = FakeNvml(simulated_gpus(1, 3), process_query_error=pynvml.NVML_ERROR_NO_PERMISSION)
    out = str(tmp_path / "refused.h5")
    result = Session(out, [("gpu0", NvmlAcquirer(NvmlDriver(lib), 0))], duration_s=1.5).run()
    with wattlab.open(out) as run:
        assert "gpu0.processes" not in run.sources and "gpu0.samples" in run.sources
        assert unread_processes(run) == [
            "wattlab: gpu0: no per-process stream (Insufficient Permissions)"]
    report(result)
    assert capsys.readouterr().err.count("no per-process stream") == 1


@pytest.mark.system
def test_the_activity_rule_misplaces_fewer_joules_than_keplers_and_says_how_many(tmp_path):
    """The whole path: demo --shared, then energy --by-process under both rules, scored
    against the simulator's truth (bench/process_energy_sim.py measures the errors).

    The demo runs in real time and the driver keeps one sample per process per read, so a
    loaded machine's late reads leave the split fewer samples and each figure's error grows
    (beside two CPU burners the small-kernel process came out 30-40 % low, where it is
    within a few % on a quiet machine; Kepler's rule then beat it on that one process).
    What load cannot move is Kepler's bias (the small-kernel process's busy SMs at a few %
    of the power): in total the activity rule misplaces fewer joules (there: 516-702 J
    against 1,177-1,488 J).
    """
    out = str(tmp_path / "shared.h5")
    assert run_cli("demo", "--shared", "--seed", "1", "-o", out).returncode == 0
    errors = {}
    for rule in ("activity", "utilisation"):
        done = run_cli("energy", out, "--by-process", "--rule", rule, "--json")
        assert done.returncode == 0, done.stderr
        gpu = json.loads(done.stdout)["gpus"][0]
        assert abs(gpu["closure_j"]) <= 1e-3 * gpu["total_j"]
        errors[rule] = {p["key"]: p["dynamic_j"] - p["truth_dynamic_j"]
                        for p in gpu["processes"]}
        for p in gpu["processes"]:  # the ± holds the truth, however wide load makes it
            assert 0 < abs(p["dynamic_j"] - p["truth_dynamic_j"]) <= p["pm_j"], (rule, p)
    assert len(errors["activity"]) == 3
    assert (sum(map(abs, errors["activity"].values()))
            < sum(map(abs, errors["utilisation"].values()))), errors
