"""Repeated `wattlab excite` runs on a real GPU: do the stated uncertainties cover the spread?

    python bench/excite_coverage.py [--runs 5 --duration 60]   # needs an NVIDIA GPU; read-only

Each run is a fresh random telegraph (seed k). Per NVML view: the kernel width, effective
delay and update period of every run with its stated standard error, the spread of the
runs, how many runs' ±2 se intervals hold the mean of the others, and the calibrated
energy error over phases of 2 s or more against the 50 Hz sample buffer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import write_json

WATTLAB = [sys.executable, "-m", "wattlab.cli"]


def one_run(folder: Path, seed: int, duration_s: float) -> dict:
    out = folder / f"excite-{seed}.h5"
    done = subprocess.run([*WATTLAB, "excite", "--duration", str(duration_s), "--seed",
                           str(seed), "-o", str(out), "--json"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"excite seed {seed} failed: {done.stderr}")
    summary = json.loads(done.stdout)
    from wattlab.runfile import read_calibrations

    records = {r.target.channel: r for r in read_calibrations(str(out))}
    for view in summary["views"]:
        energy = records[view["view"]].energy
        view["phase_error_after_pct"] = energy.mean_abs_error_after_pct
        view["phase_error_before_pct"] = energy.mean_abs_error_before_pct
        view["phases"] = energy.phases_considered
    return summary


def covered(values: np.ndarray, ses: np.ndarray) -> int:
    """Runs whose value ± 2 se holds the mean of the other runs."""
    hits = 0
    for i in range(values.size):
        others = np.delete(values, i).mean()
        hits += int(abs(values[i] - others) <= 2 * ses[i])
    return hits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--duration", type=float, default=60.0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wattlab-excite-"))
    runs = [one_run(folder, seed, args.duration) for seed in range(1, args.runs + 1)]
    rows = []
    for view in ("average_power_w", "instant_power_w"):
        per_run = [next(v for v in r["views"] if v["view"] == view) for r in runs]
        for name in ("width_s", "effective_delay_s"):
            vals = np.array([v[name]["value"] for v in per_run])
            ses = np.array([v[name]["se"] if v[name]["se"] is not None else np.inf
                            for v in per_run])
            rows.append({"view": view, "quantity": name, "values": vals.tolist(),
                         "stated_se": ses.tolist(), "spread_sd": float(vals.std(ddof=1)),
                         "covered": covered(vals, ses), "runs": len(per_run)})
        periods = np.array([v["update_period_s"] for v in per_run])
        rows.append({"view": view, "quantity": "update_period_s", "values": periods.tolist(),
                     "identifiable": [v["identifiable"] for v in per_run],
                     "phase_error_after_pct": [v["phase_error_after_pct"] for v in per_run],
                     "phase_error_before_pct": [v["phase_error_before_pct"] for v in per_run],
                     "phases": [v["phases"] for v in per_run]})
    print(f"{args.runs} runs of `wattlab excite --duration {args.duration:g}`")
    for r in rows:
        vals = ", ".join(f"{v * 1e3:.1f}" for v in r["values"])
        if "stated_se" in r:
            ses = ", ".join(f"{s * 1e3:.1f}" for s in r["stated_se"])
            print(f"{r['view']:<16} {r['quantity']:<18} ms: {vals}  (± {ses}); run-to-run sd "
                  f"{r['spread_sd'] * 1e3:.1f} ms; ±2 se covers the others' mean in "
                  f"{r['covered']}/{r['runs']}")
        else:
            print(f"{r['view']:<16} update period ms: {vals}; identifiable {r['identifiable']}; "
                  f"phase energy error ≥ 2 s before/after %: {r['phase_error_before_pct']} / "
                  f"{r['phase_error_after_pct']}")
    write_json("excite_coverage", {"benchmark": "excite_coverage", "runs": args.runs,
                                   "duration_s": args.duration, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
