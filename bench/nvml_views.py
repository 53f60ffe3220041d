"""How well NVML's views agree with each other on real H100 `excite` runs (issue 20).

    python bench/nvml_views.py [RUN.h5 ...]    # default: tests/data/traces/h100_excite*.h5

Two questions, on real recordings only:

1. Calibration repeatability: `wattlab calibrate` of the 1 s average against the 50 Hz
   buffer on every run; each run's boxcar width, effective delay and update period with its
   stated standard error, and how far each lies from the mean of the others in its own
   standard errors (coverage: |z| <= 2 on every run).
2. The reference's own error: over spans whose edges are energy-counter updates (the
   counter is placed on its 100 ms update lattice, so its difference over such a span is
   exact to the mJ), the buffer's integral against the counter's, for spans of 2, 4 and
   10 s; and over two consecutive windows of the calibrated 1 s average (where the
   deconvolution is exact, a sum of two readings), the average against both. Only runs
   whose counter was read at the update rate (`--nvml-intervals energy=0.1`) answer this.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import wattlab
from common import DATA, write_json
from wattlab.analysis.calibration import calibrate
from wattlab.analysis.calibration.deconvolved_energy import windows_from_record
from wattlab.analysis.energy import at_updates

SPANS_S = (2.0, 4.0, 10.0)
COUNTER_READ_MAX_S = 0.15  # counter reads at least this often pin every update


def cumulative(t_s: np.ndarray, p_w: np.ndarray) -> np.ndarray:
    """Trapezoid integral of the buffer from its first sample (J)."""
    return np.concatenate(([0.0], np.cumsum(0.5 * (p_w[1:] + p_w[:-1]) * np.diff(t_s))))


def stats(err_pct: np.ndarray) -> dict[str, float]:
    return {"n": int(err_pct.size), "mean_pct": float(np.mean(err_pct)),
            "mean_abs_pct": float(np.mean(np.abs(err_pct))),
            "max_abs_pct": float(np.max(np.abs(err_pct)))}


def one_run(path: str) -> dict[str, Any]:
    with wattlab.open(path) as run:
        record = calibrate(run, "gpu0.samples", "gpu0.power:average_power_w")
        out: dict[str, Any] = {
            "run": path.rsplit("/", 1)[-1], "identifiable": record.verdict.identifiable,
            "w_s": record.params.width.to_json(),
            "effective_delay_s": record.effective_delay_s.to_json(),
            "update_period_s": {"value": record.update_period_s,
                                "se": record.update_period_se_s}}
        buf = run.source("gpu0.samples")
        t = buf.time_ns.astype(np.float64) / 1e9
        cum = cumulative(t, buf.channel("power_w").astype(np.float64))
        counter = run.source("gpu0.energy")
        reads_s = counter.time_ns.astype(np.float64) / 1e9
        if np.median(np.diff(reads_s)) > COUNTER_READ_MAX_S:
            return out
        tu, ju = at_updates(reads_s, counter.channel("energy_j").astype(np.float64))
        keep = (tu > t[0]) & (tu < t[-1])
        tu, ju = tu[keep], ju[keep]

        def buffer_j(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.interp(b, t, cum) - np.interp(a, t, cum)

        for span_s in SPANS_S:
            step = round(span_s / 0.1)
            a, b = np.arange(0, tu.size - step, step), np.arange(step, tu.size, step)
            e_counter = ju[b] - ju[a]
            out[f"buffer_vs_counter_{span_s:g}s"] = stats(
                100 * (buffer_j(tu[a], tu[b]) - e_counter) / e_counter)
        win = windows_from_record(run, record)
        ends = win.end_s
        later = np.searchsorted(ends, ends + win.width_s - 0.5 * float(np.median(np.diff(ends))))
        i = np.flatnonzero(later < ends.size)
        j = later[i]
        a, b = ends[i] - win.width_s, ends[j]
        inside = (a > tu[0]) & (b < tu[-1])
        i, j, a, b = i[inside], j[inside], a[inside], b[inside]
        e_avg = (win.power_w[i] + win.power_w[j]) * win.width_s
        e_buf = buffer_j(a, b)
        e_ctr = np.interp(b, tu, ju) - np.interp(a, tu, ju)
        out["two_windows_s"] = float(2 * win.width_s)
        out["average_vs_buffer"] = stats(100 * (e_avg - e_buf) / e_buf)
        out["average_vs_counter"] = stats(100 * (e_avg - e_ctr) / e_ctr)
        out["buffer_vs_counter_two_windows"] = stats(100 * (e_buf - e_ctr) / e_ctr)
    return out


def coverage(rows: list[dict[str, Any]], key: str) -> list[float]:
    """Each run's distance from the mean of the others, in its own stated standard errors."""
    values = np.array([r[key]["value"] for r in rows])
    ses = np.array([r[key]["se"] for r in rows])
    return [float((values[k] - np.delete(values, k).mean()) / ses[k]) for k in range(len(rows))]


def main() -> None:
    paths = sys.argv[1:] or sorted(str(p) for p in (DATA / "traces").glob("h100_excite*.h5"))
    rows = [one_run(p) for p in paths]
    print(f"{'run':34} {'w ms':>12} {'z':>5} {'delay ms':>12} {'z':>5} {'period ms':>15} {'z':>5}")
    z = {k: coverage(rows, k) for k in ("w_s", "effective_delay_s", "update_period_s")}
    for k, r in enumerate(rows):
        cells = [f"{1e3 * r[key]['value']:7.1f} ± {1e3 * r[key]['se']:4.1f} {z[key][k]:+5.2f}"
                 for key in ("w_s", "effective_delay_s")]
        period = r["update_period_s"]
        cells.append(f"{1e3 * period['value']:8.3f} ± {1e3 * period['se']:4.2f} "
                      f"{z['update_period_s'][k]:+5.2f}")
        print(f"{r['run']:34} {' '.join(cells)}")
    print("\nreference's own error (runs with the counter read every 0.1 s), "
          "mean / mean |.| / max |.| %:")
    for r in rows:
        if "two_windows_s" not in r:
            continue
        for key in [*(f"buffer_vs_counter_{s:g}s" for s in SPANS_S), "average_vs_buffer",
                    "average_vs_counter", "buffer_vs_counter_two_windows"]:
            s = r[key]
            print(f"  {r['run']:34} {key:32} n={s['n']:4d} {s['mean_pct']:+6.2f} "
                  f"{s['mean_abs_pct']:5.2f} {s['max_abs_pct']:5.2f}")
    write_json("nvml_views", {"runs": rows, "coverage_z": z})


if __name__ == "__main__":
    main()
