"""Who a GPU process is, read from a fake /proc tree: never a guess where it cannot be read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from wattlab.acquisition.acquirers.process_identity import (
    CGROUP_MAX,
    INIT_PID_NS,
    container_id,
    host_view,
    identify,
    pod_uid,
    slurm_ids,
    start_ticks,
)

DOCKER = "a" * 64
POD = "1b2c3d4e-5f60-4a1b-9c2d-3e4f5a6b7c8d"


def fake_proc(root: Path, *, ns: str = INIT_PID_NS, self_nspid: str = "77") -> Path:
    """A /proc with wattlab itself (``self``) in pid namespace ``ns``."""
    me = root / "self"
    (me / "ns").mkdir(parents=True)
    os.symlink(ns, me / "ns" / "pid")
    (me / "status").write_text(f"Name:\twattlab\nNSpid:\t{self_nspid}\n")
    return root


def add_process(proc: Path, pid: int, *, comm: str = "python", uid: int = 0,
                cgroup: str = "/user.slice", nspid: str | None = None, ticks: int = 4242,
                environ: bytes = b"", cmdline: bytes = b"python\0train.py\0") -> None:
    d = proc / str(pid)
    d.mkdir()
    (d / "comm").write_text(comm + "\n")
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                              f"NSpid:\t{nspid or pid}\n")
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    fields = ["S"] + ["0"] * 18 + [str(ticks)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm} with) spaces) " + " ".join(fields) + "\n")
    (d / "environ").write_bytes(environ)
    (d / "cmdline").write_bytes(cmdline)


@pytest.mark.fast
def test_a_host_process_has_command_user_cgroup_and_start(tmp_path):
    proc = fake_proc(tmp_path / "proc")
    add_process(proc, 4100, comm="python3", uid=0, ticks=987654)
    got = identify(4100, proc=proc, pods=tmp_path / "pods")
    assert got["local_pid"] == 4100 and got["comm"] == "python3" and got["user"] == "root"
    assert got["start_ticks"] == 987654 == start_ticks(4100, proc)
    assert got["cgroup"] == "/user.slice" and got["cmdline"] is None  # no option: none shown
    assert identify(4100, proc=proc, pods=tmp_path, cmdlines=True)["cmdline"] == "python train.py"


@pytest.mark.fast
def test_an_unknown_uid_is_its_number_and_a_gone_process_is_all_none(tmp_path):
    proc = fake_proc(tmp_path / "proc")
    add_process(proc, 5, uid=4_000_000)
    assert identify(5, proc=proc)["user"] == "4000000"
    gone = identify(6, proc=proc)
    assert set(gone.values()) == {None}


@pytest.mark.fast
def test_wattlab_in_a_container_with_its_own_proc_knows_no_host_pid(tmp_path):
    """NVML's host pid 4100 may be another process in this /proc: never guessed."""
    proc = fake_proc(tmp_path / "proc", ns="pid:[4026532999]")
    add_process(proc, 4100, comm="bash")
    assert not host_view(proc)
    got = identify(4100, proc=proc)
    assert got["local_pid"] is None and got["comm"] is None and got["start_ticks"] is None


@pytest.mark.fast
def test_a_host_proc_seen_from_a_nested_namespace_maps_through_nspid(tmp_path):
    """wattlab nested (its NSpid has two fields) under a host /proc: the local pid is the
    second field of the process's NSpid; a process outside wattlab's namespace has none."""
    proc = fake_proc(tmp_path / "proc", ns="pid:[4026532999]", self_nspid="900\t7")
    add_process(proc, 4100, nspid="4100\t12")
    add_process(proc, 4200)  # on the host only
    assert host_view(proc)
    assert identify(4100, proc=proc)["local_pid"] == 12
    only_host = identify(4200, proc=proc)
    assert only_host["local_pid"] is None and only_host["comm"] is None


@pytest.mark.fast
@pytest.mark.parametrize("cgroup", [
    f"/system.slice/docker-{DOCKER}.scope",
    f"/docker/{DOCKER}",
    f"/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{DOCKER}.scope",
    f"/kubepods/burstable/pod{POD}/crio-{DOCKER}.scope",
    f"/machine.slice/libpod-{DOCKER}.scope/container",
])
def test_container_ids_from_each_runtime(cgroup):
    assert container_id(cgroup) == DOCKER


@pytest.mark.fast
def test_pod_uid_from_systemd_and_cgroupfs_paths_and_none_outside_kubernetes():
    systemd = ("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
               f"{POD.replace('-', '_')}.slice")
    assert pod_uid(systemd) == POD
    assert pod_uid(f"/kubepods/burstable/pod{POD}/x") == POD
    assert pod_uid(f"/system.slice/docker-{DOCKER}.scope") is None  # a container without a pod


@pytest.mark.fast
def test_pod_name_and_namespace_from_the_kubelet_log_folder(tmp_path):
    proc = fake_proc(tmp_path / "proc")
    add_process(proc, 4100, cgroup=f"/kubepods/pod{POD}/{DOCKER}")
    pods = tmp_path / "pods"
    (pods / f"ml-team_trainer-7f9c_{POD}").mkdir(parents=True)
    (pods / "other_pod_0000").mkdir()
    got = identify(4100, proc=proc, pods=pods)
    assert (got["pod_uid"], got["pod_namespace"], got["pod_name"]) == (POD, "ml-team",
                                                                       "trainer-7f9c")
    unreadable = identify(4100, proc=proc, pods=tmp_path / "nowhere")
    assert unreadable["pod_uid"] == POD and unreadable["pod_name"] is None


@pytest.mark.fast
def test_slurm_job_and_step_from_the_cgroup_then_from_the_environment(tmp_path):
    assert slurm_ids("/slurm/uid_1000/job_4242/step_0/user/task_0", None) == ("4242", "0")
    assert slurm_ids("/system.slice/slurmstepd.scope/job_99/step_batch/user", None) == (
        "99", "batch")
    assert slurm_ids("/user.slice", b"PATH=/bin\0SLURM_JOB_ID=7\0SLURM_STEP_ID=3\0") == (
        "7", "3")
    assert slurm_ids("/user.slice", None) == (None, None)
    proc = fake_proc(tmp_path / "proc")
    add_process(proc, 10, environ=b"SLURM_JOB_ID=55\0")
    got = identify(10, proc=proc)
    assert (got["slurm_job"], got["slurm_step"]) == ("55", None)


@pytest.mark.fast
def test_long_cgroup_and_command_line_keep_the_payload_under_2_kb(tmp_path):
    proc = fake_proc(tmp_path / "proc")
    add_process(proc, 10, cgroup="/" + "x" * 5000, cmdline=b"y" * 9000)
    got = identify(10, proc=proc, cmdlines=True)
    assert len(got["cgroup"]) == CGROUP_MAX and got["cgroup"].endswith("…")
    assert got["cmdline"].endswith("…")
    assert len(json.dumps({"gpu": 0, "pid": 10, **got}).encode()) < 2048
