"""`wattlab slurm`: two tasks as two "nodes" (srun's variables), and a real Slurm."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from tests.conftest import free_port
from tests.process_runs import NODE1, NODE1_GAIN, PROCS, write_two_nodes
from wattlab.acquisition.session import SlurmTask, job_summary
from wattlab.acquisition.session.slurm_job import comment_text
from wattlab.analysis.attribution import energy_by_process
from wattlab.cli import main
from wattlab.runfile import Run

WATTLAB = [sys.executable, "-m", "wattlab.cli"]
OFFSET_GOAL_NS = 50_000  # one host: both "nodes" share a clock, so the estimate is the error


def slurm_env(tmp_path: Path, proc_id: int, ntasks: int = 2) -> dict[str, str]:
    """What srun sets for task ``proc_id`` of a one-task-per-node step."""
    return {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_PROCID": str(proc_id),
            "SLURM_NODEID": str(proc_id), "SLURM_NTASKS": str(ntasks),
            "SLURM_JOB_NUM_NODES": str(ntasks), "SLURM_JOB_NODELIST": f"n[0-{ntasks - 1}]",
            "SLURMD_NODENAME": f"n{proc_id}", "SLURM_SUBMIT_DIR": str(tmp_path)}


def energy_rows(path: Path) -> list[dict]:
    done = subprocess.run([*WATTLAB, "energy", str(path), "--json"], capture_output=True,
                          text=True, timeout=60, check=True)
    return [r for r in json.loads(done.stdout)["rows"] if r["phase"] == "run"]


@pytest.mark.system
def test_two_tasks_record_one_job_into_one_run_file(tmp_path, spawn):
    out = tmp_path / "job.h5"
    args = ["slurm", "-o", str(out), "--simulate", "--nvml-streams", "samples,power",
            "--listen-address", "127.0.0.1"]
    # the agent task may start first: it waits for task 0's note
    agent = spawn([*WATTLAB, *args], env=slurm_env(tmp_path, 1), cwd=tmp_path,
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)
    task0 = subprocess.run([*WATTLAB, *args, "--duration", "4"], env=slurm_env(tmp_path, 0),
                           cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           check=False)
    agent_out = agent.communicate(timeout=60)[0]
    assert task0.returncode == 0, task0.stderr
    assert agent.returncode == 0, agent_out
    assert "job 4242: GPU energy" in task0.stdout
    assert "job comment not set" in task0.stdout  # no such job here (or no scontrol): said
    assert not (tmp_path / ".wattlab-slurm-4242").exists()  # the job's keys are gone
    summary = json.loads((tmp_path / "slurm-4242.wattlab.json").read_text())
    assert set(summary["nodes"]) == {"node0", "node1"}
    own = summary["processes"]  # the job's share, or why there is none: never silent
    assert (own["this_job"] is None) != (own["this_job_unknown"] is None)
    assert "this job's processes: " in task0.stdout
    # per node: the same figure `wattlab energy` gives for that node's GPU stream
    rows = {(r["source"], r["channel"]): r["energy_j"] for r in energy_rows(out)}
    for node, info in summary["nodes"].items():
        assert info["gpu_streams"] == [f"{node}.gpu0.samples:power_w"]
        assert info["gpu_energy_j"] == pytest.approx(rows[(f"{node}.gpu0.samples", "power_w")],
                                                     rel=1e-9)
        assert info["gpu_energy_j"] > 500
    assert summary["total_gpu_energy_j"] == pytest.approx(
        sum(n["gpu_energy_j"] for n in summary["nodes"].values()), rel=1e-12)
    with h5py.File(out) as f:
        assert {"node0.gpu0.samples", "node1.gpu0.samples"} <= set(f["sources"])
        assert f["sources/node1.gpu0.samples"].attrs.get("remote_host") == "node1"
        assert abs(float(f["sync/node1"].attrs["offset_ns"])) < OFFSET_GOAL_NS


@pytest.mark.fast
def test_outside_a_slurm_step_it_says_so(tmp_path, monkeypatch, capsys):
    for key in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    assert main(["slurm", "-o", str(tmp_path / "j.h5"), "--simulate", "--duration", "1"]) == 2
    assert "not a task of a Slurm job step" in capsys.readouterr().err


def two_node_task(tmp_path: Path, job_id: str) -> SlurmTask:
    return SlurmTask(job_id, 0, 0, 2, 2, "n0", str(tmp_path))


@pytest.mark.fast
def test_the_summary_charges_the_job_its_own_processes_on_shared_gpus(tmp_path):
    path = str(write_two_nodes(tmp_path / "job.h5"))
    summary = job_summary(path, two_node_task(tmp_path, "4711"))
    with Run(path) as run:
        split = {g.prefix: g for g in energy_by_process(run).gpus}
    own = summary["processes"]
    truth_j = PROCS[0].truth_j() + NODE1[1].truth_j() * NODE1_GAIN  # pid 101 on n0, 505 on n1
    assert own["this_job"]["energy_j"] == pytest.approx(truth_j, rel=0.01)
    assert own["this_job"]["processes"] == 2 and own["this_job"]["valid"]
    assert 0 < own["this_job"]["pm_j"] < 0.02 * truth_j and own["this_job_unknown"] is None
    gpus = {g["gpu"]: g for g in own["gpus"]}
    assert set(gpus) == {"node0.gpu0", "node1.gpu0"}
    n0, n1 = gpus["node0.gpu0"], gpus["node1.gpu0"]
    assert n0["this_job"]["energy_j"] == pytest.approx(PROCS[0].truth_j(), rel=0.01)
    assert set(n0["other_jobs"]) == {"4712"} and set(n1["other_jobs"]) == {"4713"}
    assert n0["other_jobs"]["4712"]["energy_j"] == pytest.approx(PROCS[1].truth_j(), rel=0.01)
    assert n0["no_job"]["processes"] == 1 and n1["no_job"] is None  # the memory holder
    assert n0["rule"] == "activity" and "static" in own["not_charged"]
    for prefix, g in gpus.items():  # static and idle stay the GPU's: charged to no job
        assert g["not_charged"]["static_j"] == pytest.approx(split[prefix].static_j)
        assert g["not_charged"]["idle_j"] == pytest.approx(split[prefix].idle_j)
        assert g["not_charged"]["idle_j"] > 0
    # the GPU totals as before: the densest stream per GPU, summed over nodes
    assert summary["total_gpu_energy_j"] == pytest.approx(
        sum(g.stream.energy_j or 0 for g in split.values()), rel=1e-9)
    text = comment_text(summary)
    assert (f"this job's processes {own['this_job']['energy_j'] / 1e3:.3f}±"
            f"{own['this_job']['pm_j'] / 1e3:.3f}; node0") in text
    json.dumps(summary)  # what publish writes


@pytest.mark.fast
def test_a_gpu_without_a_process_stream_gives_its_reason_never_a_zero(tmp_path):
    path = str(write_two_nodes(tmp_path / "job.h5", node1_processes=False))
    summary = job_summary(path, two_node_task(tmp_path, "4711"))
    own = summary["processes"]
    assert own["this_job"] is None and "node1.gpu0 (" in own["this_job_unknown"]
    gpus = {g["gpu"]: g for g in own["gpus"]}
    assert "no node1.gpu0.processes stream" in gpus["node1.gpu0"]["reason"]
    assert "energy_j" not in gpus["node1.gpu0"]
    assert gpus["node0.gpu0"]["this_job"]["processes"] == 1  # what is known stays
    assert "this job's processes" not in comment_text(summary)
    assert summary["nodes"]["node1"]["gpu_energy_j"] > 0


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.3)
    return False


@pytest.fixture
def slurm_cluster(tmp_path):
    """A private one-node Slurm (its own munged socket, config and ports), or a skip."""
    tools = {t: shutil.which(t) for t in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")}
    missing = [t for t, p in tools.items() if p is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing; Debian: "
                    "apt-get install slurm-wlm)")
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld/slurmd here needs root")
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        pytest.skip(f"no munge key at {key}")
    base = tmp_path / "slurm"
    for sub in ("state", "spool", "log"):
        (base / sub).mkdir(parents=True)
    host = socket.gethostname()
    sock = base / "munge.sock"
    conf = base / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=wattlabtest", f"SlurmctldHost={host}", "AuthType=auth/munge",
        f"AuthInfo=socket={sock}", f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SlurmUser=root", "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        f"StateSaveLocation={base / 'state'}", f"SlurmdSpoolDir={base / 'spool'}",
        f"SlurmctldLogFile={base / 'log/ctld.log'}", f"SlurmdLogFile={base / 'log/d.log'}",
        f"SlurmctldPidFile={base / 'ctld.pid'}", f"SlurmdPidFile={base / 'd.pid'}",
        f"NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN",
        f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = [subprocess.Popen(
        [tools["munged"], "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
         f"--pid-file={base / 'munged.pid'}", f"--log-file={base / 'log/munged.log'}",
         f"--seed-file={base / 'munged.seed'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        if not _wait(sock.exists, 10):
            pytest.skip("munged did not start (its socket never appeared)")
        procs.append(subprocess.Popen([tools["slurmctld"], "-D", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([tools["slurmd"], "-D", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def idle() -> bool:
            state = subprocess.run([tools["sinfo"], "-h", "-o", "%t"], env=env,
                                   capture_output=True, text=True, check=False).stdout
            return state.strip() == "idle"

        if not _wait(idle, 30):
            logs = "; ".join(p.read_text()[-300:] for p in (base / "log").glob("*.log"))
            pytest.skip(f"slurmctld/slurmd did not bring the node up in 30 s: {logs}")
        yield env
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.mark.system
def test_a_real_slurm_job_records_both_tasks_and_sets_the_comment(tmp_path, slurm_cluster):
    env = slurm_cluster
    script = tmp_path / "job.sh"
    src = Path(__file__).resolve().parents[1] / "src"
    script.write_text(
        "#!/bin/sh\n#SBATCH -n 2 -o slurm-%j.out\n"
        f"export PYTHONPATH={src}\n"
        f"srun {sys.executable} -m wattlab.cli slurm -o job.h5 --simulate --nvml-streams "
        "samples --listen-address 127.0.0.1 --duration 3\n")
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=30, check=True)
    job = submitted.stdout.strip().split(";")[0]
    summary = tmp_path / f"slurm-{job}.wattlab.json"
    assert _wait(summary.exists, 90), (tmp_path / f"slurm-{job}.out").read_text()
    data = json.loads(summary.read_text())

    def finished() -> bool:
        return not subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                                  text=True, check=False).stdout.strip()

    assert _wait(finished, 60)  # the job's processes end before the daemons do
    assert set(data["nodes"]) == {"task0", "task1"}  # one node, two tasks
    shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True,
                           text=True, timeout=30, check=True).stdout
    total_kj = data["total_gpu_energy_j"] / 1e3
    assert f"Comment=wattlab GPU energy kJ: total {total_kj:.3f}" in shown
