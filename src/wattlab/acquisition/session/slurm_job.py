"""A Slurm job's GPUs and meters in one run file: one recorder, one agent per other task.

Run as ``srun --ntasks-per-node=1 wattlab slurm -o job.h5 -- CMD``. Every task reads the
variables srun sets. Task 0 makes the CurveZMQ keys in a folder beside the output (the
job's working folder is shared by its nodes, as it must be for the output itself), binds
the recorder and writes where it listens; every other task waits for that note, then runs
an agent with its own key. Task 0 records its own node's GPUs, runs CMD, and at the end
writes the job's energy per node and in total where Slurm users look: a JSON file beside
the job's output and the job's comment (``scontrol update``, shown by ``sacct``); where
the run has per-process streams, each GPU's split by job (``share_of_job``): on a shared GPU
the job is charged its own processes only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wattlab.errors import UsageError, WattlabError
from wattlab.sync.bus import create_keypair

if TYPE_CHECKING:
    from wattlab.runfile import Run

RENDEZVOUS_TIMEOUT_S = 60.0
STREAM_PREFERENCE = ("samples", "power", "energy")  # one stream per GPU: the densest
COMMENT_MAX = 200


@dataclass(frozen=True)
class SlurmTask:
    """The calling process's place in the job step, from srun's environment."""

    job_id: str
    proc_id: int
    node_id: int
    ntasks: int
    nnodes: int
    node_name: str
    submit_dir: str

    @staticmethod
    def from_env(env: Mapping[str, str]) -> SlurmTask:
        missing = [k for k in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS")
                   if not env.get(k)]
        if missing:
            raise UsageError(f"not a task of a Slurm job step ({', '.join(missing)} unset): "
                             "start it with srun inside an allocation, one task per node")
        try:
            ntasks, proc_id = int(env["SLURM_NTASKS"]), int(env["SLURM_PROCID"])
            node_id = int(env.get("SLURM_NODEID", "0"))
            nnodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1")
        except ValueError as e:
            raise UsageError(f"malformed Slurm task variables: {e}") from e
        return SlurmTask(env["SLURM_JOB_ID"], proc_id, node_id, ntasks, nnodes,
                         env.get("SLURMD_NODENAME") or socket.gethostname(),
                         env.get("SLURM_SUBMIT_DIR") or os.getcwd())

    def name_of(self, proc_id: int) -> str:
        """A task's agent name: ``node<N>`` with one task per node (the intended use)."""
        return f"node{proc_id}" if self.ntasks == self.nnodes else f"task{proc_id}"

    @property
    def name(self) -> str:
        return self.name_of(self.proc_id)

    @property
    def others(self) -> list[str]:
        return [self.name_of(i) for i in range(1, self.ntasks)]


def rendezvous_dir(output: str, job_id: str) -> Path:
    return Path(output).resolve().parent / f".wattlab-slurm-{job_id}"


def prepare(task: SlurmTask, folder: Path, listen_host: str, port: int) -> str:
    """Task 0: keys for everyone, the agents' allow folder, then the endpoint note."""
    if folder.exists():
        raise UsageError(f"{folder}: left by an earlier step of job {task.job_id}; remove it")
    folder.mkdir(mode=0o700)
    (folder / "allowed").mkdir(mode=0o700)
    create_keypair(folder, "recorder")
    for name in task.others:
        public, _ = create_keypair(folder, name)
        shutil.copy(public, folder / "allowed" / public.name)
    advertised = socket.gethostname() if listen_host in ("0.0.0.0", "::") else listen_host
    endpoint = f"tcp://{advertised}:{port}"
    note = folder / "endpoint.tmp"
    note.write_text(endpoint)
    note.rename(folder / "endpoint")  # whole or absent: agents never read half of it
    return endpoint


def await_endpoint(folder: Path, timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> str:
    """Other tasks: wait for task 0's note (on the shared folder)."""
    deadline = time.monotonic() + timeout_s
    note = folder / "endpoint"
    while not note.exists():
        if time.monotonic() > deadline:
            raise WattlabError(f"no recorder note {note} after {timeout_s:g} s: did task 0 "
                               "start, and is this folder shared between the nodes?")
        time.sleep(0.1)
    return note.read_text().strip()


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def node_energy(report: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """Per node: its GPUs' energy over the run (one stream per GPU) and its meters'.

    A GPU's streams ``<node>.gpuN.samples|power|energy`` measure the same board: the
    densest present counts. Meters (other streams) are listed per stream, not summed in
    (a wall meter includes the GPUs).
    """
    rows = [r for r in report["rows"] if r["phase"] == "run" and r["energy_j"] is not None]
    out: dict[str, Any] = {}
    for node in nodes:
        gpus: dict[str, tuple[int, float, str]] = {}
        meters: dict[str, float] = {}
        for r in rows:
            node_of, _, rest = r["source"].partition(".")
            if node_of != node:
                continue
            device, _, stream = rest.rpartition(".")
            if device.startswith("gpu") and stream in STREAM_PREFERENCE:
                if stream == "power" and r["channel"] != "average_power_w":
                    continue
                rank = STREAM_PREFERENCE.index(stream)
                if device not in gpus or rank < gpus[device][0]:
                    gpus[device] = (rank, float(r["energy_j"]), f"{r['source']}:{r['channel']}")
            else:
                meters[f"{r['source']}:{r['channel']}"] = float(r["energy_j"])
        out[node] = {"gpu_energy_j": sum(e for _, e, _ in gpus.values()),
                     "gpu_streams": sorted(s for _, _, s in gpus.values()),
                     "meters_j": meters}
    return out


def job_summary(run_path: str, task: SlurmTask) -> dict[str, Any]:
    """The job's energy per node and in total, and its processes' share of each GPU."""
    from wattlab.analysis.energy import energy_report
    from wattlab.runfile import Run

    with Run(run_path) as run:
        report = energy_report(run, by_marker=False)
        hosts = {sid.partition(".")[0]: str(v.descriptor.get("host", ""))
                 for sid, v in run.sources.items()}
        phase = report["phases"][0]
        processes = job_processes(run, task.job_id)
    nodes = node_energy(report, [task.name, *task.others])
    for name, info in nodes.items():
        info["host"] = hosts.get(name, "")
    return {"job_id": task.job_id, "run_file": run_path,
            "span_s": [phase["t0_s"], phase["t1_s"]],
            "total_gpu_energy_j": sum(n["gpu_energy_j"] for n in nodes.values()),
            "nodes": nodes, "processes": processes}


def job_processes(run: Run, job_id: str) -> dict[str, Any]:
    """The job's processes' share of each GPU (``share_of_job``).

    A split that cannot be made is said in ``this_job_unknown``: the GPU totals are still
    published.
    """
    from wattlab.analysis.attribution import NOT_CHARGED, energy_by_process, share_of_job

    try:
        return share_of_job(energy_by_process(run, unit="auto"), job_id)
    except UsageError as e:
        return {"job_id": job_id, "rule": None, "not_charged": NOT_CHARGED, "this_job": None,
                "this_job_unknown": f"no per-process split: {e}", "gpus": []}


def comment_text(summary: dict[str, Any]) -> str:
    parts = [f"{n} {v['gpu_energy_j'] / 1e3:.3f}" for n, v in summary["nodes"].items()]
    mine = (summary.get("processes") or {}).get("this_job")
    own = ("" if mine is None else
           f"; this job's processes {mine['energy_j'] / 1e3:.3f}±{mine['pm_j'] / 1e3:.3f}"
           + ("" if mine["valid"] else " (NOT valid)"))
    text = (f"wattlab GPU energy kJ: total {summary['total_gpu_energy_j'] / 1e3:.3f}{own}; "
            + ", ".join(parts))
    return text if len(text) <= COMMENT_MAX else text[:COMMENT_MAX - 3] + "..."


def publish(summary: dict[str, Any], task: SlurmTask) -> list[str]:
    """The summary beside the job's output and in its comment; what was done, as lines."""
    said = []
    path = Path(task.submit_dir) / f"slurm-{task.job_id}.wattlab.json"
    path.write_text(json.dumps(summary, indent=2))
    said.append(f"job energy written to {path}")
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        said.append("no scontrol here: job comment not set")
        return said
    done = subprocess.run([scontrol, "update", f"job={task.job_id}",
                           f"comment={comment_text(summary)}"], capture_output=True,
                          text=True, timeout=30, check=False)
    said.append("job comment set (sacct --format=JobID,Comment%200)" if done.returncode == 0
                else f"job comment not set: {done.stderr.strip() or done.returncode}")
    return said
