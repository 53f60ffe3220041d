"""Does NVML's energy counter move on a regular grid, and do sweep-paced reads pin it?

    python bench/counter_grid.py [--seconds 20] [--simulate]

``analysis/energy/counter_ticks.py`` puts each counter read at the update it shows, once the reads
pin the update grid. Its premise came from the H100 capture in ``tests/data``; this checks
it on the GPU at hand, read-only:

1. The counter is read back to back; each change is seen between two reads ~one call
   apart. A grid (period, phase) is fitted to those change intervals: the period, how far
   the changes stray from the grid, and how many change intervals the grid misses.
2. Reads every 100 ms are taken out of that record, as a sweep reads, once for each 1 ms
   offset, each read up to ``--late-ms`` late at random (a reader wakes late, never early):
   how often they pin the grid, and where ``update_phase_s`` puts it against the fitted
   grid (ms).
3. Where they pin it, windows of 0.1, 0.3 and 1 s at random places: energy from those
   100 ms reads, as read and as placed, against the back-to-back record (J).
Without a GPU it reads the simulated one (the simulator's 100 ms grid).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import numpy.typing as npt

from common import open_nvml, write_json
from wattlab.analysis.energy import COUNTER_UPDATE_S, at_updates
from wattlab.analysis.energy.counter_ticks import update_phase_s
from wattlab.drivers.nvml import NvmlDriver

FloatArray = npt.NDArray[np.float64]
WINDOWS_S = (0.1, 0.3, 1.0)
SWEEP_READ_S = 0.1


def back_to_back(driver: NvmlDriver,
                 seconds: float) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(call-middle s, half the call s, J) of counter reads done one after another.

    The half call is kept because the value comes from anywhere inside the call: a read
    preempted mid-call (a busy machine) is known only to within it.
    """
    t_s, half_s, values = [], [], []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t0 = time.monotonic()
        value = driver.read_energy_j(0)
        t1 = time.monotonic()
        t_s.append(0.5 * (t0 + t1) - start)
        half_s.append(0.5 * (t1 - t0))
        values.append(value)
    return np.array(t_s), np.array(half_s), np.array(values)


def change_intervals(t_s: FloatArray, half_s: FloatArray,
                     values: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(after, by, reach) of each change: the update fell between these two reads, at most
    ``reach`` from their middle (half the pair's spacing plus the longer half call)."""
    moved = np.flatnonzero(np.diff(values) != 0)
    after, by = t_s[moved], t_s[moved + 1]
    reach = 0.5 * (by - after) + np.maximum(half_s[moved], half_s[moved + 1])
    return after, by, reach


def fit_grid(after_s: FloatArray, by_s: FloatArray, reach_s: FloatArray) -> dict[str, float]:
    """Least-squares grid through the change intervals' middles, and how well it fits.

    ``period_bound_ms``: the most the fitted period can be off a true regular grid, each
    change being anywhere within ``reach_s`` of its middle (the slope's error is
    sum((k - mean k) e_k) / sum((k - mean k)^2) with |e_k| <= reach_k). It grows with the
    reads a busy machine delays, instead of a margin tuned until green.
    """
    middle = 0.5 * (after_s + by_s)
    k = np.round((middle - middle[0]) / COUNTER_UPDATE_S)
    period_s, phase_s = np.polyfit(k, middle, 1)
    lever = np.abs(k - k.mean())
    bound_s = float(np.sum(lever * reach_s) / np.sum(lever**2))
    grid = phase_s + period_s * k
    stray = middle - grid
    outside = np.maximum(after_s - grid, 0.0) + np.maximum(grid - by_s, 0.0)
    return {"period_ms": 1e3 * period_s, "period_bound_ms": 1e3 * bound_s,
            "phase_s": float(phase_s % COUNTER_UPDATE_S),
            "stray_p50_ms": 1e3 * float(np.median(np.abs(stray))),
            "stray_max_ms": 1e3 * float(np.max(np.abs(stray))),
            "interval_p50_ms": 1e3 * float(np.median(by_s - after_s)),
            "outside_max_ms": 1e3 * float(np.max(outside)), "changes": int(after_s.size)}


def nominal_grid(after_s: FloatArray, by_s: FloatArray,
                 reach_s: FloatArray) -> tuple[float, float]:
    """(room left s, phase s) of one grid of exactly ``COUNTER_UPDATE_S`` through every change.

    Each change lies within ``reach_s`` of its interval's middle; a grid of that period
    passes through all of them iff max(lo - kP) <= min(hi - kP). Negative: no such grid
    (a period off the nominal one, or updates off any grid). Only changes known to within a
    quarter period count: they are numbered k without doubt, and a wider one (a read
    preempted for a whole update) holds a grid point whatever the phase.
    """
    middle = 0.5 * (after_s + by_s)
    sharp = reach_s < 0.25 * COUNTER_UPDATE_S
    middle, reach = middle[sharp], reach_s[sharp]
    k = np.round((middle - middle[0]) / COUNTER_UPDATE_S)
    on_grid = middle - COUNTER_UPDATE_S * k
    lo, hi = float(np.max(on_grid - reach)), float(np.min(on_grid + reach))
    return hi - lo, 0.5 * (lo + hi) % COUNTER_UPDATE_S


def sweep_reads(t_s: FloatArray, offset_s: float, late_s: FloatArray) -> npt.NDArray[np.int64]:
    """Indices of the first reads after a 100 ms schedule from ``offset_s``, each late by
    its entry of ``late_s``."""
    schedule = np.arange(t_s[0] + offset_s, t_s[-1] - SWEEP_READ_S, SWEEP_READ_S)
    late = late_s[:schedule.size]
    return np.unique(np.clip(np.searchsorted(t_s, schedule + late), 0, t_s.size - 1))


def window_errors(t_s: FloatArray, values: FloatArray, truth: tuple[FloatArray, FloatArray],
                  starts_s: FloatArray, length_s: float) -> FloatArray:
    """|energy from these reads - energy from the back-to-back record| per window, J."""
    ends = starts_s + length_s
    got = np.interp(ends, t_s, values) - np.interp(starts_s, t_s, values)
    want = np.interp(ends, *truth) - np.interp(starts_s, *truth)
    return np.asarray(np.abs(got - want))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--late-ms", type=float, default=5.0,
                        help="a sweep read is up to this late, uniformly at random")
    parser.add_argument("--simulate", action="store_true")
    args = parser.parse_args()
    driver = open_nvml(args.simulate)
    try:
        t_s, half_s, values = back_to_back(driver, args.seconds)
    finally:
        driver.close()
    after_s, by_s, reach_s = change_intervals(t_s, half_s, values)
    grid = fit_grid(after_s, by_s, reach_s)
    slack_s, nominal_phase_s = nominal_grid(after_s, by_s, reach_s)
    grid["nominal_slack_ms"] = 1e3 * slack_s
    # pinned phases are compared with the nominal grid where it fits (known to within its
    # slack), else with the fitted one (whose phase a busy machine's reads drag)
    reference_s = nominal_phase_s if slack_s >= 0 else grid["phase_s"]
    # the record's own truth: each new value at the middle of the interval it appeared in
    truth = (np.concatenate([[t_s[0]], 0.5 * (after_s + by_s)]),
             np.concatenate([[values[0]], values[1:][np.diff(values) != 0]]))
    rng = np.random.default_rng(1)
    starts = rng.uniform(t_s[0] + 0.5, t_s[-1] - 1.5, 400)
    pinned, phase_off_ms, worst_half_call_ms = 0, [], []
    errors: dict[str, dict[str, list[float]]] = {
        f"{w:g}s": {"as_read": [], "placed": []} for w in WINDOWS_S}
    offsets = np.arange(0.0, SWEEP_READ_S, 0.001)
    for offset in offsets:
        i = sweep_reads(t_s, offset, rng.uniform(0, 1e-3 * args.late_ms, t_s.size))
        phase = update_phase_s(t_s[i], values[i])
        if phase is None:
            continue  # kept as read: nothing to compare
        pinned += 1
        off = (phase - reference_s + 0.5 * COUNTER_UPDATE_S) % COUNTER_UPDATE_S
        phase_off_ms.append(1e3 * (off - 0.5 * COUNTER_UPDATE_S))
        # a read's value comes from anywhere in its call: its time is known to within this
        worst_half_call_ms.append(1e3 * float(half_s[i].max()))
        placed_s, placed_j = at_updates(t_s[i], values[i])
        for w in WINDOWS_S:
            row = errors[f"{w:g}s"]
            row["as_read"] += window_errors(t_s[i], values[i], truth, starts, w).tolist()
            row["placed"] += window_errors(placed_s, placed_j, truth, starts, w).tolist()
    mean_w = float((values[-1] - values[0]) / (t_s[-1] - t_s[0]))
    print(f"{'simulated' if args.simulate else 'real'} GPU, {t_s.size} reads in "
          f"{t_s[-1] - t_s[0]:.1f} s, mean power {mean_w:.1f} W")
    print(f"grid: period {grid['period_ms']:.4f} ms (± {grid['period_bound_ms']:.4f} ms "
          f"from the reads' spacing) over {grid['changes']} changes; changes "
          f"stray {grid['stray_p50_ms']:.2f} ms (median), {grid['stray_max_ms']:.2f} ms (max) "
          f"from it; seen within {grid['interval_p50_ms']:.2f} ms; the grid falls "
          f"{grid['outside_max_ms']:.2f} ms at most outside the read pair that saw a change; "
          f"a grid of exactly {1e3 * COUNTER_UPDATE_S:g} ms fits every change with "
          f"{grid['nominal_slack_ms']:.3f} ms to spare (< 0: none fits)")
    offs = np.array(phase_off_ms)
    print(f"100 ms reads up to {args.late_ms:g} ms late, {offsets.size} offsets: grid pinned "
          f"for {pinned}"
          + (f"; pinned phase vs the grid {np.median(offs):+.2f} ms median, "
             f"{np.max(np.abs(offs)):.2f} ms worst" if pinned else ""))
    summary: dict[str, dict[str, float]] = {}
    print(f"{'window':>7} {'as read p50 J':>14} {'p99 J':>8} {'max J':>8} "
          f"{'placed p50 J':>13} {'p99 J':>8} {'max J':>8}")
    for name, e in errors.items() if pinned else ():
        quantiles = {f"{kind}_{q}_j": float(np.quantile(e[kind], p))
                     for kind in ("as_read", "placed")
                     for q, p in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}
        summary[name] = quantiles
        print(f"{name:>7} " + " ".join(f"{v:>{width}.2f}" for v, width in
                                       zip(quantiles.values(), (14, 8, 8, 13, 8, 8),
                                           strict=True)))
    write_json("counter_grid", {"benchmark": "counter_grid", "simulated": args.simulate,
                                "seconds": args.seconds, "late_ms": args.late_ms,
                                "reads": int(t_s.size),
                                "mean_power_w": mean_w, "grid": grid,
                                "offsets": int(offsets.size), "pinned": pinned,
                                "pinned_phase_off_ms": offs.tolist(),
                                "pinned_worst_half_call_ms": worst_half_call_ms,
                                "window_errors": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
