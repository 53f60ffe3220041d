"""Iteration detection against GPU-synchronised step markers, on real H100 training traces.

For every trace in tests/data/traces with ``truth_step`` markers (steps bracketed by
``torch.cuda.synchronize()``), over the marked training (first step − 0.3 periods to last
step's end + 0.1 s):

- truth: the markers' count; energy per iteration from the 50 Hz samples integrated over
  the marker windows (begin to next begin), steady iterations only;
- power: ``wattlab iterations --markers none`` (burst segmentation, no markers);
- online: ``IterationStream`` fed 1 s at a time, as a live reader would;
- auto: ``--markers auto`` (the framework's own step markers, host time);
- the online path's CPU per 1 s push at 50 Hz and 20 kHz.

The confidence of power segments is a logistic fitted on simulated training loops (random
step lengths, jitter, levels, pauses) with their true steps; ``--fit`` refits it (half the
loops fit, the other half check) and prints the coefficients for
``power_segments.CONFIDENCE_COEF``. Usage:

    python bench/iterations_real.py [--fit] [--loops 300]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import wattlab
from common import DATA, write_json
from wattlab.analysis.iterations import IterationResult, IterationStream, iterations
from wattlab.analysis.iterations.iteration_result import steady_stats
from wattlab.analysis.iterations.power_segments import (
    CONFIDENCE_COEF,
    confidence_features,
    segment,
)
from wattlab.hardware.training_schedule import TrainingLoop, simulated_training

TRACES = DATA / "traces"
SOURCE = "gpu0.samples"
COUNT_TOL, ENERGY_TOL = 0.05, 0.10


def rel(value: float | None, truth: float | None) -> float:
    if value is None or truth is None or truth == 0:
        return math.nan
    return (value - truth) / truth


def right(r: IterationResult, count: int, energy_j: float | None) -> bool:
    """The goal: count within 5 % and energy per iteration within 10 %."""
    return (abs(r.count - count) <= COUNT_TOL * count
            and abs(rel(r.energy_per_iteration_j, energy_j)) <= ENERGY_TOL)


def training_window_s(path: Path) -> tuple[float, float, float] | None:
    """From 0.3 periods before the first marked step to 0.1 s after the last one ends, and
    the median step on the GPU (s)."""
    with wattlab.open(str(path)) as run:
        begins = sorted(m.time_ns for m in run.markers
                        if m.name == "truth_step" and m.kind == "begin")
        ends = sorted(m.time_ns for m in run.markers if m.name == "truth_step" and m.kind == "end")
    if len(begins) < 3:
        return None
    period_s = float(np.median(np.diff(begins))) / 1e9
    busy_s = float(np.median(np.subtract(ends, begins))) / 1e9
    return begins[0] / 1e9 - 0.3 * period_s, ends[-1] / 1e9 + 0.1, busy_s


def online(path: Path, window: tuple[float, float]) -> IterationResult:
    """The live path: 1 s of samples per push, as the recorder delivers them."""
    with wattlab.open(str(path)) as run:
        view = run.source(SOURCE)
        t, p = view.time_ns, view.channel("power_w").astype(np.float64)
    keep = (t >= window[0] * 1e9) & (t <= window[1] * 1e9)
    t, p = t[keep], p[keep]
    cuts = np.searchsorted(t, np.arange(t[0], t[-1], 1_000_000_000))[1:]
    return segment(zip(np.split(t, cuts), np.split(p, cuts), strict=True))


def trace_row(path: Path) -> dict[str, Any] | None:
    marked = training_window_s(path)
    if marked is None:
        return None
    a, b, busy_s = marked
    with wattlab.open(str(path)) as run:
        truth = iterations(run, SOURCE, markers="truth_step", t0_s=a, t1_s=b)
        power = iterations(run, SOURCE, markers="none", t0_s=a, t1_s=b)
        auto = iterations(run, SOURCE, markers="auto", t0_s=a, t1_s=b)
    live = online(path, (a, b))
    e_truth = truth.energy_per_iteration_j
    return {
        "trace": path.stem, "truth_count": truth.count, "truth_period_s": truth.period_s,
        "truth_energy_j": e_truth, "gpu_step_s": busy_s, "spacing_s": 1 / truth.rate_hz,
        "goal_applies": busy_s >= 3 / truth.rate_hz,
        "power_method": power.method, "power_count": power.count,
        "count_error": rel(power.count, truth.count),
        "power_energy_j": power.energy_per_iteration_j,
        "power_energy_se_j": power.energy_per_iteration_se_j,
        "energy_error": rel(power.energy_per_iteration_j, e_truth),
        "confidence": power.confidence, "power_resolvable": power.resolvable,
        "right": right(power, truth.count, e_truth),
        "online_count": live.count, "online_energy_j": live.energy_per_iteration_j,
        "auto_method": auto.method, "auto_markers": auto.markers, "auto_count": auto.count,
        "auto_energy_error": rel(auto.energy_per_iteration_j, e_truth),
        "auto_resolvable": auto.resolvable, "warnings": power.warnings + auto.warnings,
    }


def online_cost(rate_hz: int, seconds: int = 120) -> dict[str, Any]:
    """CPU per 1 s push of a 0.4 s square wave with noise (what ``tune`` adds per second)."""
    rng = np.random.default_rng(1)
    stream = IterationStream()
    cpu_s = 0.0
    for k in range(seconds):
        t = (np.arange(k * rate_hz, (k + 1) * rate_hz) * (1e9 / rate_hz)).astype(np.int64)
        p = np.where((t / 1e9) % 0.4 < 0.2, 600.0, 120.0) + rng.normal(0, 20, rate_hz)
        start = time.process_time()
        stream.push(t, p)
        cpu_s += time.process_time() - start
    return {"rate_hz": rate_hz, "seconds": seconds, "cpu_ms_per_push": 1e3 * cpu_s / seconds,
            "core_percent": 100 * cpu_s / seconds, "held_samples": stream.held_samples,
            "count": stream.state.count}


def random_loop(rng: np.random.Generator) -> TrainingLoop:
    """A loop from the range real jobs span, and past it: some must fail for the fit."""
    return TrainingLoop(
        steps=int(rng.integers(40, 90)),
        busy_s=float(np.exp(rng.uniform(np.log(0.015), np.log(0.5)))),
        wait_s=float(np.exp(rng.uniform(np.log(0.01), np.log(0.6)))),
        jitter=float(rng.uniform(0.0, 0.6)), busy_util=float(rng.uniform(0.1, 1.0)),
        wait_util=float(rng.uniform(0.0, 0.3)), util_jitter=float(rng.uniform(0.0, 0.4)),
        pause_every=int(rng.choice([0, 0, 10, 20])), pause_s=float(rng.uniform(0.5, 3.0)))


def true_step_energies_j(starts_s: np.ndarray, gpu: Any) -> np.ndarray:
    """The simulated GPU's own energy of each step, begin to next begin (the truth)."""
    starts_ns = np.round(starts_s * 1e9).astype(np.int64)
    return np.array([gpu.true_energy_j(int(a), int(b))
                     for a, b in itertools.pairwise(starts_ns)])


def loop_arguments(doc: str | None, fit_help: str) -> argparse.Namespace:
    """``--fit`` (refit a confidence on half the simulated loops) and ``--loops``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--fit", action="store_true", help=fit_help)
    parser.add_argument("--loops", type=int, default=300, help="simulated loops")
    return parser.parse_args()


def print_bands(bands: list[dict[str, Any]], what: str) -> None:
    """The held-out reliability table: per confidence band, loops, mean, share right."""
    print(f"| {what} band | loops (held out) | mean confidence | share right |")
    print("|---|---|---|---|")
    for b in bands:
        print(f"| {b['band']} | {b['n']} | {b['mean_confidence']:.2f} | "
              f"{100 * b['share_right']:.0f} % |")


def simulated_rows(loops: int) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(19)
    for seed in range(loops):
        loop = random_loop(rng)
        t, p, starts, gpu = simulated_training(loop, seed)
        r = segment([(t, p)])
        stats = steady_stats(np.diff(starts), true_step_energies_j(starts, gpu))
        e_truth = None if stats is None else stats.energy_j
        features = None
        if r.count and r.period_spacings and r.regular_fraction is not None:
            features = confidence_features(r.regular_fraction, r.separation or 0.0,
                                           r.period_spacings, r.thin_dips or 0.0).tolist()
        rows.append({"seed": seed, "loop": loop.__dict__, "count": r.count,
                     "truth_count": loop.steps, "energy_error": rel(r.energy_per_iteration_j,
                                                                    e_truth),
                     "confidence": r.confidence, "features": features,
                     "right": right(r, loop.steps, e_truth)})
    return rows


def fit_logistic(x: np.ndarray, y: np.ndarray, ridge: float = 1e-2) -> np.ndarray:
    """Maximum-likelihood logistic coefficients (Newton's method, a small ridge)."""
    w = np.zeros(x.shape[1])
    for _ in range(50):
        prob = 1 / (1 + np.exp(-(x @ w)))
        grad = x.T @ (prob - y) + ridge * w
        hess = (x * (prob * (1 - prob))[:, None]).T @ x + ridge * np.eye(x.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w


def reliability(pred: np.ndarray, ok: np.ndarray) -> list[dict[str, Any]]:
    """Per confidence band: how many, mean confidence, share right."""
    out = []
    for lo, hi in ((0, 0.2), (0.2, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.01)):
        sel = (pred >= lo) & (pred < hi)
        if sel.any():
            out.append({"band": f"{lo:.2f}-{min(hi, 1):.2f}", "n": int(sel.sum()),
                        "mean_confidence": float(pred[sel].mean()),
                        "share_right": float(ok[sel].mean())})
    return out


def held_out_check(rows: list[dict[str, Any]], fit: bool, coef: np.ndarray) -> dict[str, Any]:
    """Fit on even seeds (when asked; else ``coef``), check on odd seeds: confidence vs
    share right, over the rows that have features."""
    usable = [r for r in rows if r["features"] is not None]
    x = np.array([r["features"] for r in usable])
    y = np.array([float(r["right"]) for r in usable])
    train = np.array([r["seed"] % 2 == 0 for r in usable])
    coef = fit_logistic(x[train], y[train]) if fit else coef
    pred = 1 / (1 + np.exp(-(x @ coef)))
    held = ~train
    return {"coefficients": coef.tolist(), "fitted_now": fit, "loops": len(rows),
            "detected": len(usable), "held_out": reliability(pred[held], y[held]),
            "brier_held_out": float(np.mean((pred[held] - y[held]) ** 2)),
            "base_rate": float(y.mean())}


def calibration(rows: list[dict[str, Any]], fit: bool) -> dict[str, Any]:
    """The power-segments confidence, checked (or refitted) on simulated loops."""
    undetected = [r for r in rows if r["features"] is None]
    return {**held_out_check(rows, fit, CONFIDENCE_COEF),
            "right_when_undetected": sum(r["right"] for r in undetected)}


def fmt(x: Any, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main() -> int:
    args = loop_arguments(__doc__, "refit the confidence")
    rows = [r for p in sorted(TRACES.glob("*.h5")) if (r := trace_row(p)) is not None]
    print("| trace | steps (markers) | period | GPU step | ≥ 3 spacings | method | count | "
          "count err | "
          "J/iter (markers) | J/iter (power) | energy err | confidence | online count | "
          "auto markers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        auto = f"{r['auto_method']} ({r['auto_markers']}) {r['auto_count']}"
        found = (f"{r['power_count']} | {fmt(100 * r['count_error'], '+.1f')} % | "
                 f"{fmt(r['truth_energy_j'], '.2f')} | {fmt(r['power_energy_j'], '.2f')} ± "
                 f"{fmt(r['power_energy_se_j'], '.2f')} | {fmt(100 * r['energy_error'], '+.1f')} %"
                 if r["power_resolvable"] else
                 f"not resolvable | - | {fmt(r['truth_energy_j'], '.3f')} | - | -")
        print(f"| {r['trace']} | {r['truth_count']} | {fmt(r['truth_period_s'] * 1e3, '.0f')} ms"
              f" | {r['gpu_step_s'] * 1e3:.0f} ms | {'yes' if r['goal_applies'] else 'no'} | "
              f"{r['power_method']} | {found} | {r['confidence']:.2f} | {r['online_count']} | "
              f"{auto} |")
    sims = simulated_rows(args.loops)
    cal = calibration(sims, args.fit)
    print(f"\nconfidence: coefficients {np.round(cal['coefficients'], 3).tolist()} "
          f"({'fitted now' if args.fit else 'as in power_segments.CONFIDENCE_COEF'}); "
          f"{cal['detected']}/{cal['loops']} simulated loops segmented, "
          f"{100 * cal['base_rate']:.0f} % of those right; Brier (held out) "
          f"{cal['brier_held_out']:.3f}")
    print_bands(cal["held_out"], "confidence")
    real = [r for r in rows if r["goal_applies"]]
    print(f"\nreal traces with steps ≥ 3 sample spacings: {sum(r['right'] for r in real)}/"
          f"{len(real)} right (count ±5 %, energy ±10 %); all traces: "
          f"{sum(r['right'] for r in rows)}/{len(rows)}")
    costs = [online_cost(rate) for rate in (50, 20_000)]
    print("\n| online stream | CPU per 1 s push | share of a core | samples held |")
    print("|---|---|---|---|")
    for c in costs:
        print(f"| {c['rate_hz']} Hz | {c['cpu_ms_per_push']:.2f} ms | {c['core_percent']:.3f} % | "
              f"{c['held_samples']} |")
    path = write_json("iterations_real", {"benchmark": "iterations_real", "traces": rows,
                                          "calibration": cal, "simulated": sims,
                                          "online_cost": costs})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
