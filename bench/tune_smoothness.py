"""Could the tuner pool settings to estimate a slowdown? How smooth the published surfaces are.

    python bench/tune_smoothness.py

Certifying a setting at 4.8 % against a 5 % bound needs its slowdown to ~0.2 %. Pooling
(a monotone or parametric fit of time across measured settings instead of each setting's
own mean) only helps if the surface is that smooth: per one-knob table, how often time
rises with the setting (a monotone fit would be wrong there), and the error of predicting
each setting's time from its two neighbours (linear in 1/clock for SM clocks, in the
limit for power limits), the least bias such a fit would carry.
"""

from __future__ import annotations

import numpy as np

from common import DATA, write_json
from wattlab.tuning.surfaces import public_surfaces


def main() -> None:
    rows = []
    print(f"{'table':16s} {'steps':>6s} {'rising':>6s} {'interp err % med':>16s} "
          f"{'p90':>6s} {'max':>6s}")
    for table, surfaces in public_surfaces(DATA / "public").items():
        if not surfaces or len(surfaces[0].axes) != 1:
            continue  # the Titan X times are modelled, smooth by construction
        errs, rising, steps = [], 0, 0
        for s in surfaces:
            x = np.array(next(iter(s.axes.values())))
            u = 1.0 / x if "sm_clock" in s.axes else x
            t = s.time_s
            w = (u[1:-1] - u[:-2]) / (u[2:] - u[:-2])
            errs += list(np.abs((t[:-2] + w * (t[2:] - t[:-2])) / t[1:-1] - 1.0))
            rising += int((np.diff(t) > 0).sum())
            steps += len(t) - 1
        if not errs:
            continue
        e = 100 * np.array(errs)
        row = {"table": table, "steps": steps, "time_rises": rising,
               "interp_err_pct_median": float(np.median(e)),
               "interp_err_pct_p90": float(np.percentile(e, 90)),
               "interp_err_pct_max": float(e.max())}
        rows.append(row)
        print(f"{table:16s} {steps:6d} {rising:6d} {row['interp_err_pct_median']:16.3f} "
              f"{row['interp_err_pct_p90']:6.3f} {row['interp_err_pct_max']:6.2f}")
    write_json("tune_smoothness", {"rows": rows})


if __name__ == "__main__":
    main()
