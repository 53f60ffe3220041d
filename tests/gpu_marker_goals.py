"""The issue-26 goals for a run with GPU-timed step markers, shared by the device test
(which records new runs) and the tests on the kept H100 traces (tests/data/traces).

- >= 95 % of the energy above idle during training lies inside the step windows (GPU time);
- each step the 50 Hz samples resolve has the same energy from ``wattlab energy
  --by-marker`` as from the samples' own trapezoids over the same GPU-time window, within
  5 % (a step of a few hundred µs, e.g. one with no GPU work at an epoch's end, is counted
  but not compared: no 50 Hz stream says anything about it);
- the host-GPU pairing is known to within 1 % of a step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import wattlab
from wattlab.analysis.energy.source_energy import energy_report, phases_from_markers

SAMPLES = "gpu0.samples"
FLOOR_QUANTILE = 5  # idle: the 5th percentile of the run's samples (the jobs idle 2 s first)
BUSY_FRACTION = 0.5  # training: from the first to the last sample this far above idle


def integral_j(t_s: np.ndarray, p_w: np.ndarray, a: float, b: float) -> float:
    """Trapezoids of the raw samples from a to b, the edges interpolated (independent of
    wattlab's integrator)."""
    inside = (t_s > a) & (t_s < b)
    t = np.concatenate([[a], t_s[inside], [b]])
    p = np.concatenate([[np.interp(a, t_s, p_w)], p_w[inside], [np.interp(b, t_s, p_w)]])
    return float(np.sum(0.5 * (p[1:] + p[:-1]) * np.diff(t)))


def measure(job: str, path: Path) -> dict[str, Any]:
    """The goals' numbers for one recorded job (also written to $OUT)."""
    with wattlab.open(str(path)) as run:
        view = run.source(SAMPLES)
        t_s, p_w = view.time_ns / 1e9, view.channel("power_w").astype(np.float64)
        markers = run.markers
        report = energy_report(run, by_marker=True)
    steps = [p for p in phases_from_markers(markers) if p.name == "step"]
    step_marks = [m for m in markers if m.name == "step"]
    assert steps, f"{job}: no step phases recorded"
    idle_w = float(np.percentile(p_w, FLOOR_QUANTILE))
    busy = np.flatnonzero(p_w > idle_w + BUSY_FRACTION * (np.percentile(p_w, 99) - idle_w))
    train_a, train_b = float(t_s[busy[0]]) - 0.2, float(t_s[busy[-1]]) + 0.2
    above = np.clip(p_w - idle_w, 0.0, None)
    total = integral_j(t_s, above, train_a, train_b)
    inside = sum(integral_j(t_s, above, p.t0_s, p.t1_s) for p in steps
                 if p.t1_s > train_a and p.t0_s < train_b)
    rows = {r["phase"]: r for r in report["rows"]
            if r["source"] == SAMPLES and r["phase"].startswith("step")}
    errors = []
    for p in steps:
        if rows[p.label].get("resolves") is False:
            continue
        mine = integral_j(t_s, p_w, p.t0_s, p.t1_s)
        errors.append(100 * (rows[p.label]["energy_j"] - mine) / mine)
    host = [m.time_ns for m in step_marks]
    gpu = [m.gpu_time_ns for m in step_marks if m.gpu_time_ns is not None]
    result = {
        "job": job, "steps": len(steps), "clock": sorted({p.clock for p in steps}),
        "idle_w": idle_w, "training_s": train_b - train_a,
        "energy_above_idle_j": total, "inside_steps_j": inside,
        "inside_steps_pct": 100 * inside / total,
        "step_s_median_gpu": float(np.median([p.duration_s for p in steps])),
        # how long after the host's callback the GPU got there (the queue's depth)
        "gpu_after_host_ms_median": float(np.median(np.subtract(gpu, host))) / 1e6
        if len(gpu) == len(host) else None,
        "pairing_uncertainty_us_median": float(np.median(
            [m.gpu_uncertainty_ns for m in step_marks if m.gpu_uncertainty_ns is not None]))
        / 1e3,
        "step_energy_j_median": float(np.median([rows[p.label]["energy_j"] for p in steps])),
        "step_energy_error_pct_max": float(np.max(np.abs(errors))),
        "markers_with_gpu_time": len(gpu), "step_markers": len(host),
        "steps_compared": len(errors),
    }
    return result




def assert_goals(result: dict[str, Any]) -> None:
    assert result["markers_with_gpu_time"] == result["step_markers"]
    assert result["clock"] == ["gpu"]
    assert 0.05 <= result["step_s_median_gpu"] <= 1.0  # not the host's few ms
    assert result["pairing_uncertainty_us_median"] < 0.01 * result["step_s_median_gpu"] * 1e6
    assert result["inside_steps_pct"] >= 95.0
    assert result["steps_compared"] >= 0.9 * result["steps"]
    assert result["step_energy_error_pct_max"] <= 5.0
