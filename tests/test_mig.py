"""MIG (issue 41): the simulated H100 in MIG mode, the fake driver's MIG and GPM calls, the
``gpu{i}.mig`` stream, and ``energy --by-instance`` against the simulator's truth."""

from __future__ import annotations

import json

import numpy as np
import pynvml
import pytest

from tests.test_nvml_source import UNIX_MINUS_MONO, FakeClock, run_for
from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.acquirers.nvml_acquirer import NvmlAcquirer
from wattlab.acquisition.acquirers.nvml_cadence import parse_intervals
from wattlab.analysis.attribution import energy_by_process
from wattlab.cli import main
from wattlab.drivers.nvml import NvmlDriver
from wattlab.drivers.nvml_samples import GpmActivity, mig_devices
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.shared_gpu import MigLoad, mig_layout, mig_simulated_gpu
from wattlab.runfile import Run
from wattlab.samples import Gap, Marker

S = 1_000_000_000
PROFILES = ["3g.40gb", "2g.20gb", "2g.20gb"]


def mig(**gpu_kwargs) -> tuple[FakeNvml, MigLoad, FakeClock]:
    clock = FakeClock()
    gpu = mig_simulated_gpu(PROFILES, 2, 20.0, lead_s=0.0, clock_ns=clock, start_ns=clock(),
                            unix_offset_ns=UNIX_MINUS_MONO, **gpu_kwargs)
    assert isinstance(gpu.processes, MigLoad)
    return FakeNvml([gpu]), gpu.processes, clock


def reader(lib: FakeNvml, clock: FakeClock, **kwargs) -> NvmlAcquirer:
    return NvmlAcquirer(NvmlDriver(lib), 0, clock_ns=clock, wall_clock_ns=clock.wall,
                        sleep=clock.sleep, **kwargs)


@pytest.mark.fast
def test_the_fake_answers_mig_calls_as_an_h100_does():
    lib, load, clock = mig()
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    clock.t_ns += 5 * S
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no per-process utilisation on MIG
        lib.nvmlDeviceGetProcessUtilization(h, 0)
    devices = mig_devices(lib, h)
    assert [(d.gi, d.profile, d.sm_count, d.slices) for d in devices] == [
        (1, "3g.40gb", 60, 3), (2, "2g.20gb", 32, 2), (3, "2g.20gb", 32, 2)]
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no per-instance power
        lib.nvmlDeviceGetPowerUsage(devices[0].handle)
    with pytest.raises(pynvml.NVMLError_NotFound):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(h, 3)
    running = {p.pid: p.gpuInstanceId for p in lib.nvmlDeviceGetComputeRunningProcesses(h)}
    assert running == load.instance_of
    activity = GpmActivity(lib, h, [1, 2, 3])
    assert activity.read() == {}  # the first samples only
    t0_s = (clock() - lib.gpus[0].start_ns) / 1e9
    clock.t_ns += 2 * S
    got = activity.read()
    want = load.instance_activity(t0_s, t0_s + 2.0)
    assert {gi: pytest.approx(v) for gi, v in want.items()} == got
    assert any(sm > 0 for sm, _ in got.values())
    activity.close()
    assert lib._gpm_samples() == {}  # every sample freed


@pytest.mark.fast
def test_gpm_refuses_samples_of_two_instances_or_out_of_order():
    lib, _, clock = mig()
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    a, b = lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()
    lib.nvmlGpmMigSampleGet(h, 1, a)
    clock.t_ns += S
    lib.nvmlGpmMigSampleGet(h, 2, b)
    got = pynvml.c_nvmlGpmMetricsGet_t()
    got.numMetrics, got.sample1, got.sample2 = 1, a, b
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlGpmMetricsGet(got)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlGpmMigSampleGet(h, 9, a)  # no such instance


@pytest.mark.fast
@pytest.mark.parametrize(("profiles", "why"), [(["9g.1gb"], "not one of"),
                                               (["4g.40gb", "4g.40gb"], "8 slices")])
def test_a_layout_that_is_no_h100_s_is_refused(profiles, why):
    with pytest.raises(ValueError, match=why):
        mig_layout(profiles)


@pytest.mark.fast
def test_a_mig_gpu_records_each_instance_in_place_of_the_processes():
    lib, _, clock = mig()
    acq = reader(lib, clock)
    descriptors = {d.source_id: d for d in acq.open()}
    assert "gpu0.processes" not in descriptors
    d = descriptors["gpu0.mig"]
    assert [i["profile"] for i in d.config["instances"]] == PROFILES
    assert "Not Supported" in d.config["instance_power"]
    got = run_for(acq, clock, 12.0)
    rows = np.concatenate([r.values for r in got if isinstance(r, Chunk)
                           and r.source_id == "gpu0.mig"])
    assert set(rows[:, 0].astype(int)) == {1, 2, 3}
    assert (rows[:, 1] > 0).any() and np.isfinite(rows).all()
    assert rows.shape[0] > 3 * 12 / 0.2  # the 0.09 s default, not the state reads' 0.9 s
    lib2, _, clock2 = mig()
    slow = reader(lib2, clock2, intervals_s=parse_intervals("mig=0.9"))
    slow.open()
    fewer = [r for r in run_for(slow, clock2, 12.0) if isinstance(r, Chunk)
             and r.source_id == "gpu0.mig"]
    assert 3 * 10 <= sum(len(r.values) for r in fewer) <= 3 * 15
    truth = [r for r in got if getattr(r, "name", "") == "simulated-truth"]
    assert set(truth[-1].payload["instances_dynamic_j"]) == {"gi1", "gi2", "gi3"}
    arrived = [r for r in got if isinstance(r, Marker) and r.name == "process"]
    assert {m.source for m in arrived} == {"gpu0.mig"}
    assert sorted(m.payload["gi"] for m in arrived) == [1, 2, 3]  # one process a slice
    assert all(m.payload["comm"] and m.payload["cgroup"] for m in arrived)
    assert {m.payload["slurm_job"] for m in arrived} >= {"7001"}


@pytest.mark.fast
def test_a_failing_read_is_a_gap_and_a_gpu_without_gpm_says_why():
    lib, _, clock = mig()
    acq = reader(lib, clock)
    acq.open()
    run_for(acq, clock, 2.0)
    lib.process_query_error = pynvml.NVML_ERROR_GPU_IS_LOST
    gaps = [r for r in run_for(acq, clock, 1.0) if isinstance(r, Gap)
            and r.source == "gpu0.mig"]
    assert gaps and "GPU is lost" in gaps[0].reason
    lib2, _, clock2 = mig(unsupported={"nvmlGpmMigSampleGet"})
    descriptors = reader(lib2, clock2).open()
    assert "gpu0.mig" not in [x.source_id for x in descriptors]
    assert "GPM is not supported" in descriptors[0].config["missing"]["mig"]


@pytest.mark.fast
@pytest.mark.parametrize("argv", [["--mig", "3g.40gb,9g.1gb"], ["--mig", "3g.40gb", "--shared"]])
def test_demo_refuses_a_bad_mig_layout_with_exit_2(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        code = main(["demo", *argv, "-o", str(tmp_path / "m.h5")])
        raise SystemExit(code)
    assert e.value.code == 2
    assert not (tmp_path / "m.h5").exists()


@pytest.mark.system
def test_demo_mig_then_energy_by_instance_meets_the_truth(tmp_path, capsys):
    """The activity rule on GPM's activity: every instance closer to its truth than Kepler's
    rule, the largest within 3 %; the parts add up to the counter."""
    out = str(tmp_path / "mig.h5")
    assert main(["demo", "--mig", ",".join(PROFILES), "--duration", "16", "-o", out]) == 0
    capsys.readouterr()
    split = {}
    for rule in ("activity", "utilisation"):
        assert main(["energy", out, "--by-instance", "--rule", rule, "--json"]) == 0
        split[rule] = json.loads(capsys.readouterr().out)
    gpu = split["activity"]["gpus"][0]
    parts = (sum(p["energy_j"] for p in gpu["processes"]) + gpu["static_j"] + gpu["idle_j"]
             + gpu["unattributed_j"])
    assert parts == pytest.approx(gpu["total_j"], rel=1e-3)
    errors = {rule: {p["label"]: abs(p["dynamic_j"] / p["truth_dynamic_j"] - 1)
                     for p in split[rule]["gpus"][0]["processes"]} for rule in split}
    assert set(errors["activity"]) == {"gpu0:gi1 3g.40gb", "gpu0:gi2 2g.20gb",
                                       "gpu0:gi3 2g.20gb"}
    assert errors["activity"]["gpu0:gi1 3g.40gb"] < 0.03, errors
    assert all(errors["activity"][k] < errors["utilisation"][k] for k in errors["activity"])
    assert main(["energy", out, "--by-instance"]) == 0
    text = capsys.readouterr().out
    assert "\n  = instances " in text and "(charged to instances: neither)" in text
    assert "\ninstance " in text and "gpu0:gi3 2g.20gb" in text
    assert main(["energy", out, "--by-process"]) == 0
    assert "Not Supported" in capsys.readouterr().out
    # a job's share on a MIG GPU is its instances': the processes' markers name them
    by_gi = {p["identity"]["gi"]: p for p in gpu["processes"]}
    assert main(["energy", out, "--by-job", "--json"]) == 0
    jobs = {g["name"]: g for g in json.loads(capsys.readouterr().out)["groups"]["rows"]}
    mine = [p for p in by_gi.values() if p["identity"]["slurm_job"] == "7001"]
    assert len(mine) == 2 and all(p["identity"]["pids"] for p in mine)
    assert jobs["7001"]["energy_j"] == pytest.approx(sum(p["energy_j"] for p in mine))
    assert main(["energy", out, "--by-pod", "--json"]) == 0
    pods = json.loads(capsys.readouterr().out)["groups"]["rows"]
    assert any(g["name"].startswith("00000001-") for g in pods)
    with Run(out) as run:  # what the Slurm job summary asks for
        assert energy_by_process(run, unit="auto").unit == "instance"
