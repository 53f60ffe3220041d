"""`tune --simulate` on the published surfaces: what tune measures against each surface's truth.

    python bench/tune_simulate.py                 # 2 surfaces per family, 30 s runs
    python bench/tune_simulate.py --quick         # 1 surface per family, 20 s runs

Why: bench/tune_sim.py drives the search with per-iteration costs straight from a table;
this runs the whole of ``wattlab tune`` (session, recorder, iterations found in the 50 Hz
power samples, settings applied through NVML) on the simulated GPU following a surface
(Zeus A40/V100 power limits, Kernel Tuner RTX 4000 Ada/A100 SM clocks, Ulisboa Titan X
memory x SM clocks), so each iteration lasts and costs what the surface says at the setting
in force. Per family: the settings tune measured (>= 3 iterations), how many met the
surface's slowdown and saving within 3 of tune's standard errors (+0.5 %), the largest
errors, and the kept setting's true slowdown and saving against the oracle's.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from common import DATA, write_json
from wattlab.commands.tune import driver_on_surface
from wattlab.runfile.tuning_record import read_tuning
from wattlab.tuning.online import TunePlan, run_tune
from wattlab.tuning.search import SearchConfig
from wattlab.tuning.surfaces import Surface, public_surfaces

Z, FLOOR = 3.0, 0.005  # as tests/test_tune_surfaces.py


def measure(surface: Surface, duration_s: float, folder: Path, seed: int) -> dict[str, float]:
    """One tune run on the surface: per-probe errors against the truth, and the kept one."""
    driver, _ = driver_on_surface(surface.response(), seed=seed)
    out = folder / f"{surface.name.replace('/', '_')[:60]}-{seed}.h5"
    try:
        outcome = run_tune(TunePlan(list(surface.axes), SearchConfig(min_iters=3, max_iters=8),
                                    duration_s=duration_s), driver, str(out), simulate=True)
    finally:
        driver.close()
    record = read_tuning(str(out))
    assert record is not None
    p = record.probes
    n = met = 0
    err_t = err_e = 0.0
    for k in range(1, len(p.energy_j)):
        if p.iterations[k] < 3:
            continue
        slow, saving = surface.truth({kn: float(v[k]) for kn, v in p.settings.items()})
        tr, er = p.time_s[k] / p.time_s[0], p.energy_j[k] / p.energy_j[0]
        se_t = tr * math.hypot(p.time_se_s[k] / p.time_s[k], p.time_se_s[0] / p.time_s[0])
        se_e = er * math.hypot(p.energy_se_j[k] / p.energy_j[k], p.energy_se_j[0] / p.energy_j[0])
        n += 1
        met += (abs(tr - 1 - slow) <= Z * se_t + FLOOR) and (abs(1 - er - saving)
                                                             <= Z * se_e + FLOOR)
        err_t, err_e = max(err_t, abs(tr - 1 - slow)), max(err_e, abs(1 - er - saving))
    s = outcome.summary
    true_slow, true_saving = surface.truth(s["chosen"])
    oracle = surface.setting(surface.oracle("energy", s["max_slowdown"]))
    return {"probes": n, "met": met, "max_err_slowdown": err_t, "max_err_saving": err_e,
            "kept_true_slowdown": true_slow, "kept_true_saving": true_saving,
            "kept_measured_saving": s["energy_saving_measured"],
            "kept_saving_se": s["energy_saving_se"], "oracle_saving": surface.truth(oracle)[1],
            "abandoned": sum("abandoned" in str(x) for x in p.purpose)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    per_family, duration_s = (1, 20.0) if args.quick else (2, 30.0)
    rows = []
    print(f"{'family':15s} {'runs':>4s} {'probes':>6s} {'met':>4s} {'max|dslow|':>10s} "
          f"{'max|dsave|':>10s} {'kept slow':>9s} {'kept save':>9s} {'oracle':>7s} "
          f"{'aband':>5s}")
    with tempfile.TemporaryDirectory() as tmp:
        for family, surfaces in public_surfaces(DATA / "public").items():
            picked = surfaces[:: max(1, len(surfaces) // per_family)][:per_family]
            runs = [measure(s, duration_s, Path(tmp), seed=i) for i, s in enumerate(picked)]
            row = {"family": family, "runs": len(runs),
                   "probes": sum(r["probes"] for r in runs), "met": sum(r["met"] for r in runs),
                   "max_err_slowdown": max(r["max_err_slowdown"] for r in runs),
                   "max_err_saving": max(r["max_err_saving"] for r in runs),
                   "kept_true_slowdown_max": max(r["kept_true_slowdown"] for r in runs),
                   "kept_true_saving_mean": sum(r["kept_true_saving"] for r in runs) / len(runs),
                   "oracle_saving_mean": sum(r["oracle_saving"] for r in runs) / len(runs),
                   "abandoned": sum(r["abandoned"] for r in runs), "runs_detail": runs}
            rows.append(row)
            print(f"{family:15s} {row['runs']:4d} {row['probes']:6d} {row['met']:4d} "
                  f"{row['max_err_slowdown']:10.2%} {row['max_err_saving']:10.2%} "
                  f"{row['kept_true_slowdown_max']:+9.1%} {row['kept_true_saving_mean']:9.1%} "
                  f"{row['oracle_saving_mean']:7.1%} {row['abandoned']:5d}")
    write_json("tune_simulate", {"rows": rows, "duration_s": duration_s, "z": Z,
                                 "floor": FLOOR})


if __name__ == "__main__":
    main()
