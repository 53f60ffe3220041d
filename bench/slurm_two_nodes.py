"""A two-"node" Slurm job on one host: one timebase, and the job's energy per node.

    python bench/slurm_two_nodes.py [--duration 10]
    python bench/slurm_two_nodes.py --quick   # 5 s

Two `wattlab slurm` processes with the variables srun sets (SLURM_JOB_ID, SLURM_PROCID,
SLURM_NODEID, SLURM_NTASKS, ...) and simulated GPUs. Both share this host's clock, so the
clock service's estimated offset of node1 is its error. The job's total (the JSON written
beside the job's output) is compared with the sum of `wattlab energy` run on the file for
each node's GPU stream.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py

from common import write_json


def env(folder: Path, proc_id: int) -> dict[str, str]:
    return {**os.environ, "SLURM_JOB_ID": "77", "SLURM_PROCID": str(proc_id),
            "SLURM_NODEID": str(proc_id), "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "n[0-1]", "SLURM_SUBMIT_DIR": str(folder)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="a 5 s job")
    args = ap.parse_args()
    if args.quick:
        args.duration = 5.0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        out = folder / "job.h5"
        cmd = [sys.executable, "-m", "wattlab.cli", "slurm", "-o", str(out), "--simulate",
               "--listen-address", "127.0.0.1"]
        agent = subprocess.Popen(cmd, env=env(folder, 1), stdout=subprocess.DEVNULL)
        time.sleep(0.3)
        subprocess.run([*cmd, "--duration", str(args.duration)], env=env(folder, 0),
                       check=True, stdout=subprocess.DEVNULL)
        agent.wait(60)
        summary = json.loads((folder / "slurm-77.wattlab.json").read_text())
        energy = json.loads(subprocess.run(
            [sys.executable, "-m", "wattlab.cli", "energy", str(out), "--json"],
            capture_output=True, text=True, check=True).stdout)
        with h5py.File(out) as f:
            offset_us = float(f["sync/node1"].attrs["offset_ns"]) / 1e3
            streams = sorted(f["sources"])
    per_node = {}
    for node, info in summary["nodes"].items():
        src, ch = info["gpu_streams"][0].split(":")
        per_node[node] = next(r["energy_j"] for r in energy["rows"] if r["phase"] == "run"
                              and r["source"] == src and r["channel"] == ch)
    total, summed = summary["total_gpu_energy_j"], sum(per_node.values())
    err_pct = 100 * (total - summed) / summed
    print(f"streams: {', '.join(streams)}")
    print(f"node1 clock offset estimate (truth 0, one host): {offset_us:+.2f} us (goal < 50)")
    print(f"job total {total:.2f} J, sum of per-node wattlab energy {summed:.2f} J: "
          f"{err_pct:+.2e} % (goal 0.1 %)")
    write_json("slurm_two_nodes", {"quick": args.quick, "offset_us": offset_us, "total_j": total,
                                   "per_node_j": per_node, "error_pct": err_pct,
                                   "streams": streams})


if __name__ == "__main__":
    main()
