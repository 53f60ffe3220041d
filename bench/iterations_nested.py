"""Steps inside bursts: iteration counts on loops whose power bursts once per group of steps.

Real traces: every trace in tests/data/traces with ``truth_step`` markers, over the marked
training (as bench/iterations_real.py), analysed by ``wattlab iterations --markers none``.
Truth: the markers' count; energy per step from the 50 Hz samples between consecutive
step begins, over the steps that no stall or evaluation follows (period ≤ 1.5× the
median): what a step costs, without the idle between groups.

Simulated loops: random loops with a stall every few steps (a loader refilling its queue,
gradient accumulation's optimizer step), steps parted by a few ms, so the GPU idles only
between groups; the confidence of ``steps-in-bursts`` answers is a logistic fitted on half
of them (``--fit``) and checked on the other half.

    python bench/iterations_nested.py [--fit] [--loops 300]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

import wattlab
from common import write_json
from iterations_real import (
    SOURCE,
    TRACES,
    held_out_check,
    loop_arguments,
    print_bands,
    right,
    training_window_s,
    true_step_energies_j,
)
from wattlab.analysis.alignment import integrate_view
from wattlab.analysis.iterations import iterations
from wattlab.analysis.iterations.inner_rhythm import inner_rhythm
from wattlab.analysis.iterations.power_segments import segment
from wattlab.analysis.iterations.steps_in_bursts import (
    STEP_CONFIDENCE_COEF,
    step_features,
    with_steps_in_bursts,
)
from wattlab.hardware.training_schedule import TrainingLoop, simulated_training

STEADY_PERIODS = 1.5


def steady_energy_per_step(starts_s: np.ndarray, energy_j: np.ndarray) -> float:
    """Mean energy of the steps no stall follows (period ≤ 1.5× the median)."""
    periods = np.diff(starts_s)
    steady = periods <= STEADY_PERIODS * np.median(periods)
    return float(np.mean(energy_j[steady]))


def trace_row(path: Path) -> dict[str, Any] | None:
    window = training_window_s(path)
    if window is None:
        return None
    a, b, busy_s = window
    with wattlab.open(str(path)) as run:
        begins = np.array(sorted(m.effective_ns for m in run.markers
                                 if m.name == "truth_step" and m.kind == "begin")) / 1e9
        view = run.source(SOURCE)
        cum = integrate_view(view, ["power_w"], begins)[0]
        found = iterations(run, SOURCE, markers="none", t0_s=a, t1_s=b)
    e_truth = steady_energy_per_step(begins, np.diff(cum.integral))
    spacing_s = 1 / found.rate_hz
    return {"trace": path.stem, "truth_count": int(begins.size), "truth_energy_j": e_truth,
            "gpu_step_s": busy_s, "goal_applies": busy_s >= 3 * spacing_s,
            "method": found.method, "count": found.count,
            "energy_j": found.energy_per_iteration_j, "confidence": found.confidence,
            "groups": found.groups, "steps_per_group": found.steps_per_group,
            "right": right(found, int(begins.size), e_truth), "warnings": found.warnings}


def random_nested_loop(rng: np.random.Generator) -> TrainingLoop:
    """Groups of steps parted by a few ms, a stall between groups; some past what works."""
    return TrainingLoop(
        steps=int(rng.integers(30, 80)),
        busy_s=float(np.exp(rng.uniform(np.log(0.03), np.log(0.4)))),
        wait_s=float(np.exp(rng.uniform(np.log(0.002), np.log(0.04)))),
        jitter=float(rng.uniform(0.0, 0.6)), busy_util=float(rng.uniform(0.3, 1.0)),
        wait_util=float(rng.uniform(0.0, 0.3)), util_jitter=float(rng.uniform(0.0, 0.3)),
        pause_every=int(rng.integers(3, 11)), pause_s=float(rng.uniform(0.2, 1.5)))


def simulated_rows(loops: int) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(29)
    for seed in range(loops):
        loop = random_nested_loop(rng)
        t, p, starts, gpu = simulated_training(loop, seed)
        e_truth = steady_energy_per_step(starts, true_step_energies_j(starts, gpu))
        segs = segment([(t, p)])
        bursts = list(segs.bursts)
        r = with_steps_in_bursts(segs, t, p)
        features = None
        if r.method == "steps-in-bursts":
            spacing_s = float(np.median(np.diff(t))) / 1e9
            idle_w, busy_w = np.percentile(p, [10, 90])
            rhythm = inner_rhythm(t, p, bursts, float(idle_w + 0.5 * (busy_w - idle_w)),
                                  spacing_s)
            features = None if rhythm is None else step_features(rhythm, spacing_s).tolist()
        rows.append({"seed": seed, "loop": loop.__dict__, "method": r.method,
                     "count": r.count, "truth_count": loop.steps,
                     "energy_error": (r.energy_per_iteration_j or math.nan) / e_truth - 1,
                     "confidence": r.confidence, "features": features,
                     "right": right(r, loop.steps, e_truth)})
    return rows


def confident_share(rows: list[dict[str, Any]], at: float = 0.9) -> tuple[int, int]:
    """(right, given) among the answers given with confidence ≥ ``at``."""
    sure = [r for r in rows if r["confidence"] >= at]
    return sum(r["right"] for r in sure), len(sure)


def main() -> int:
    args = loop_arguments(__doc__, "refit the step confidence")
    rows = [r for p in sorted(TRACES.glob("*.h5")) if (r := trace_row(p)) is not None]
    print("| trace | steps | GPU step | ≥ 3 spacings | method | count | groups × steps | "
          "J/step (truth) | J/step | confidence | right |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        groups = (f"{r['groups']} × {r['steps_per_group']:.0f}" if r["groups"] else "-")
        energy = "-" if r["energy_j"] is None else f"{r['energy_j']:.2f}"
        print(f"| {r['trace']} | {r['truth_count']} | {r['gpu_step_s'] * 1e3:.0f} ms | "
              f"{'yes' if r['goal_applies'] else 'no'} | {r['method']} | {r['count']} | "
              f"{groups} | {r['truth_energy_j']:.2f} | {energy} | {r['confidence']:.2f} | "
              f"{'yes' if r['right'] else 'no'} |")
    goal = [r for r in rows if r["goal_applies"]]
    kept = sum(r["right"] or r["confidence"] < 0.5 for r in goal)
    ok, given = confident_share(rows)
    print(f"\nreal traces with steps ≥ 3 spacings: {kept}/{len(goal)} right or below 0.5 "
          f"confidence; answers at confidence ≥ 0.9: {ok}/{given} right")
    sims = simulated_rows(args.loops)
    cal = held_out_check(sims, args.fit, STEP_CONFIDENCE_COEF)
    ok_sim, given_sim = confident_share(sims)
    print(f"\nsimulated nested loops: {cal['detected']}/{cal['loops']} answered by "
          f"steps-in-bursts, {100 * cal['base_rate']:.0f} % of those right; coefficients "
          f"{np.round(cal['coefficients'], 3).tolist()} "
          f"({'fitted now' if args.fit else 'as in steps_in_bursts.STEP_CONFIDENCE_COEF'}); "
          f"Brier (held out) {cal['brier_held_out']:.3f}; answers at confidence ≥ 0.9: "
          f"{ok_sim}/{given_sim} right")
    print_bands(cal["held_out"], "step confidence")
    path = write_json("iterations_nested", {"benchmark": "iterations_nested", "traces": rows,
                                            "calibration": cal, "simulated": sims})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
