"""A torchrun job of 4 ranks on 4 simulated GPUs: one node total, not four.

    python bench/job_torchrun.py [--seconds 10]

Every rank runs `wattlab record --per-node ... -- python tests/ddp_job.py` (gloo, CPU); only
local rank 0 records, the others run bare. Prints how many ranks ran and how many recorded,
the node total of `wattlab energy --node` against the sum of the four GPUs' energy counters
(the same joules, so the ratio shows any double count) and against the sum of their 50 Hz
sample streams integrated (an independent estimate); the goal is within 0.1 %.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import write_json

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="job-"))
    out = work / "job.h5"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TORCHELASTIC_RUN_ID": work.name}
    torchrun = Path(sys.executable).with_name("torchrun")
    subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "4", "-m",
                    "wattlab.cli", "record", "--per-node", "-o", str(out), "--simulate",
                    "--simulated-gpus", "4", "--no-live", "--", sys.executable,
                    str(ROOT / "tests" / "ddp_job.py"), str(args.seconds), str(work)],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    ranks = sorted(work.glob("rank*"))
    recorded = [p for p in ranks if p.read_text().split("\n")[0]]
    energy = json.loads(subprocess.run(
        [sys.executable, "-m", "wattlab.cli", "energy", str(out), "--json"], env=env,
        capture_output=True, text=True, check=True).stdout)
    node = json.loads(subprocess.run(
        [sys.executable, "-m", "wattlab.cli", "energy", str(out), "--node", "--json"], env=env,
        capture_output=True, text=True, check=True).stdout)["nodes"]
    run_rows = [r for r in energy["rows"] if r["phase"] == "run"]
    counters = sum(r["energy_j"] for r in run_rows if r["channel"] == "energy_j")
    samples = sum(r["energy_j"] for r in run_rows if r["channel"] == "power_w")
    total = node[0]["measured_j"]
    result = {"ranks": len(ranks), "recording_ranks": len(recorded), "nodes": len(node),
              "node_total_j": total, "sum_gpu_counters_j": counters,
              "sum_gpu_samples_j": samples,
              "vs_counters_pct": 100 * (total - counters) / counters,
              "vs_samples_pct": 100 * (total - samples) / samples}
    print(f"ranks {len(ranks)}, recording {len(recorded)}, nodes in the report {len(node)}")
    print(f"{'node total J':>14} {'Σ counters J':>14} {'diff %':>8} {'Σ samples J':>14} "
          f"{'diff %':>8}")
    print(f"{total:14.2f} {counters:14.2f} {result['vs_counters_pct']:8.4f} {samples:14.2f} "
          f"{result['vs_samples_pct']:8.4f}")
    print(f"json: {write_json('job_torchrun', result)}")
    return 0 if len(recorded) == 1 and abs(result["vs_samples_pct"]) < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
