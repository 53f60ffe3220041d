"""Phase energy of the calibrated 1 s average: shifted and scaled vs deconvolved.

    python bench/energy_fusion.py [--sim-runs 2 --sim-duration 60]
    python bench/energy_fusion.py --sim-runs 0 --real-excite 3   # on an NVIDIA GPU, read-only

For the simulated bench (`wattlab excite --simulate`, recorded in real time) and the real
H100 recordings (tests/data/traces, and the 121 s capture tests/data/h100_nvml_seed11.npz),
the 1 s average is calibrated against the 50 Hz sample buffer and its energy over every
phase of 2 s or more is compared with the buffer's: "before" is `wattlab energy
--calibration` (shift by the delay, rescale), "after" is `--deconvolve` (energy_fusion),
with the average alone and with the instant reading's record too, and each again with the
run's marks as free steps ("+marks": `fuse_records(breaks_s=mark_breaks(run))`). "floor":
mean / 90th percentile |error| % over spans of two whole windows, where the deconvolution
is exact, so the rest is the two meters' disagreement. Phases: marked ones of
2 s or more, consecutive marked steps joined into spans of 2 s or more (edges where the
load changes), and windows of 2-3.5 s slid over the run (edges anywhere). Prints a table and
writes results/energy_fusion.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import wattlab
from common import DATA, machine, write_json
from wattlab.analysis.calibration import calibrate, fuse_records, mark_breaks
from wattlab.analysis.calibration.deconvolved_energy import windows_from_record
from wattlab.analysis.energy import Phase, energy_report, phases_from_markers
from wattlab.errors import UsageError
from wattlab.importers import import_files
from wattlab.runfile import CalibrationRecord, Run

LONG_S = 2.0
WHOLE = ("session", "fit", "epoch")  # phases that hold the others
SLIDE_STEP_S = 0.73


def joined(phases: list[Phase]) -> list[tuple[float, float]]:
    """Consecutive marked steps grouped into non-overlapping spans of LONG_S or more."""
    steps = sorted((p for p in phases if p.name not in WHOLE), key=lambda p: p.t0_s)
    out: list[tuple[float, float]] = []
    start = None
    for p in steps:
        if out and p.t0_s < out[-1][1]:
            continue
        start = p.t0_s if start is None else start
        if p.t1_s - start >= LONG_S:
            out.append((start, p.t1_s))
            start = None
    return out


def errors(path: str, reference: str, records: list[CalibrationRecord], force: bool
           ) -> dict[str, Any]:
    """Mean and max |error| % per phase set, before and after deconvolution."""
    target = records[0].where
    with wattlab.open(path) as run:
        phases = phases_from_markers(run.markers)
        marked = {p.label for p in phases if p.duration_s >= LONG_S}
        spans = joined(phases)
        ref_view = run.source(reference.split(":", maxsplit=1)[0])
        t0, t1 = float(ref_view.time_ns[0]) / 1e9, float(ref_view.time_ns[-1]) / 1e9
        # 2-3.5 s long: a whole number of windows would be a telescoping sum, exact by itself
        starts = np.arange(t0 + 1.5, t1 - 2 * LONG_S, SLIDE_STEP_S)
        lengths = np.random.default_rng(0).uniform(LONG_S, 1.75 * LONG_S, starts.size)
        slides = [(float(a), float(a + n)) for a, n in zip(starts, lengths, strict=True)]
        windows = spans + slides
        kinds = {f"window#{i}" if i else "window": ("joined" if i < len(spans) else "sliding")
                 for i in range(len(windows))}
        variants: dict[str, Any] = {"before": None}
        breaks = mark_breaks(run)
        for name, recs, marks in (("after", records[:1], ()), ("after+instant", records, ()),
                                  ("breaks", records[:1], breaks),
                                  ("breaks+instant", records, breaks)):
            if len(recs) < (2 if "instant" in name else 1):
                continue
            try:
                variants[name] = fuse_records(run, recs, force=force, breaks_s=marks)
            except UsageError as e:
                variants[name] = str(e)
        out: dict[str, Any] = {"refused": {k: v for k, v in variants.items()
                                           if isinstance(v, str) and "breaks" not in k},
                               "floor": exact_span_floor(run, reference, records[0], force)}
        lags = [v.break_lag_s for v in variants.values() if hasattr(v, "break_lag_s")
                and v.break_lag_s is not None]
        out["break_lag_ms"] = [round(1e3 * g, 1) for g in lags]
        for name, fusion in variants.items():
            if isinstance(fusion, str):
                continue
            report = energy_report(run, reference=reference, calibration=records[0],
                                   windows=windows, fusion=fusion)
            ref = {r["phase"]: r for r in report["rows"]
                   if f"{r['source']}:{r['channel']}" == reference}
            by_kind: dict[str, list[float]] = {"marked": [], "joined": [], "sliding": []}
            z: list[float] = []
            for r in report["rows"]:
                kind = kinds.get(r["phase"], "marked" if r["phase"] in marked else None)
                e_ref = ref.get(r["phase"], {}).get("energy_j")
                if (f"{r['source']}:{r['channel']}" != target or kind is None
                        or r["corrected_j"] is None or not e_ref
                        or ref[r["phase"]]["uncovered_s"] > 0
                        or r["t1_s"] - r["t0_s"] < LONG_S):
                    continue
                by_kind[kind].append(abs(100 * (r["corrected_j"] - e_ref) / e_ref))
                if r["corrected_se_j"]:
                    z.append((r["corrected_j"] - e_ref) / r["corrected_se_j"])
            out[name] = {k: {"n": len(v), "mean_abs_pct": float(np.mean(v)) if v else None,
                             "max_abs_pct": float(np.max(v)) if v else None,
                             "within_1pct": float(np.mean(np.array(v) <= 1.0)) if v else None}
                         for k, v in by_kind.items()}
            out[name]["rms_z"] = float(np.sqrt(np.mean(np.square(z)))) if z else None
    return out


def exact_span_floor(run: Run, reference: str, record: CalibrationRecord, force: bool
                     ) -> dict[str, Any] | None:
    """|error| % of the calibrated average over two consecutive windows, against the reference
    over the same two windows: a span any deconvolution gets exactly (a telescoping sum), so
    what remains is the two meters' own disagreement, the floor under every phase's error."""
    try:
        win = windows_from_record(run, record, force=force)
    except UsageError:
        return None
    ref_view = run.source(reference.split(":", maxsplit=1)[0])
    t = ref_view.time_ns.astype(np.float64) / 1e9
    p = ref_view.channel(reference.split(":", maxsplit=1)[1]).astype(np.float64)
    cum = np.concatenate(([0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * np.diff(t))))
    ends = win.end_s
    starts = ends - win.width_s
    inside = (starts > t[0]) & (ends < t[-1])
    ref_w = np.where(inside, np.interp(ends, t, cum) - np.interp(starts, t, cum), np.nan)
    nvml_w = win.power_w * win.width_s
    # the reading a window later: its window starts where this one ends, to a lattice step
    k = np.searchsorted(ends, ends + win.width_s - 0.5 * float(np.median(np.diff(ends))))
    ok = k < ends.size
    i, j = np.flatnonzero(ok), k[ok]
    ref2 = ref_w[i] + ref_w[j]
    err = np.abs(100 * (nvml_w[i] + nvml_w[j] - ref2) / ref2)
    err = err[np.isfinite(err)]
    if not err.size:
        return None
    return {"n": int(err.size), "mean_abs_pct": float(np.mean(err)),
            "p90_abs_pct": float(np.percentile(err, 90)),
            "within_1pct": float(np.mean(err <= 1.0)),
            "span_s": 2 * win.width_s}


def calibrated(path: str, prefix: str, channels: tuple[str, str]) -> list[CalibrationRecord]:
    """Records of the average and the instant reading, as `wattlab calibrate` makes them."""
    with wattlab.open(path) as run:
        return [calibrate(run, f"{prefix}.samples", ch) for ch in channels]


def excite_runs(folder: Path, runs: int, duration_s: float, gpu: int | None
                ) -> list[tuple[str, str]]:
    """`wattlab excite` runs: simulated ones in parallel (each is recorded in real time);
    on a real GPU (``gpu``) one after the other, since they would share the card."""
    where = ["--simulate"] if gpu is None else ["--gpu", str(gpu)]
    label = "simulated excite" if gpu is None else f"H100 excite (GPU {gpu})"
    done = []
    jobs = []
    for seed in range(1, runs + 1):
        out = folder / f"{'sim' if gpu is None else 'gpu'}-{seed}.h5"
        proc = subprocess.Popen(
            [sys.executable, "-m", "wattlab.cli", "excite", *where, "--duration",
             str(duration_s), "--seed", str(seed), "-o", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        jobs.append((f"{label} seed {seed}", str(out), proc))
        if gpu is not None:
            proc.wait()
    for name, out, proc in jobs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed: {err}")
        done.append((name, out))
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sim-runs", type=int, default=2)
    parser.add_argument("--sim-duration", type=float, default=60.0)
    parser.add_argument("--real-excite", type=int, default=0, metavar="K",
                        help="also record K `wattlab excite` runs on GPU 0 (read-only) and "
                             "keep them in $OUT when set")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wattlab-fusion-"))
    cases: list[tuple[str, str, str, list[CalibrationRecord], bool]] = []
    runs = excite_runs(folder, args.sim_runs, args.sim_duration, None)
    if args.real_excite:
        real = excite_runs(folder, args.real_excite, args.sim_duration, 0)
        runs += real
        if os.environ.get("OUT"):  # compacted, to fit what comes back from the GPU machine
            from compact_run import compact

            for _, path in real:
                compact(path, str(Path(os.environ["OUT"], f"h100_excite-{Path(path).stem}.h5")))
    for name, path in runs:
        cases.append((name, path, "gpu0.samples:power_w",
                      calibrated(path, "gpu0", ("gpu0.power:average_power_w",
                                                "gpu0.power:instant_power_w")), False))
    for trace in sorted((DATA / "traces").glob("h100_*.h5")):
        cases.append((trace.name, str(trace), "gpu0.samples:power_w",
                      calibrated(str(trace), "gpu0", ("gpu0.power:average_power_w",
                                                      "gpu0.power:instant_power_w")), False))
    capture = str(folder / "h100_seed11.h5")
    import_files("nvml-npz", [str(DATA / "h100_nvml_seed11.npz")], capture, names=["h100"])
    seed11 = calibrated(capture, "h100", ("h100.average", "h100.instant"))
    cases.append(("h100_nvml_seed11 (first-seen times, forced)", capture,
                  "h100.samples:power_w", seed11, True))
    cases.append(("h100_nvml_seed11", capture, "h100.samples:power_w", seed11, False))
    rows = []
    for name, path, reference, records, force in cases:
        result = errors(path, reference, records, force)
        rows.append({"run": name, "identifiable": records[0].verdict.identifiable,
                     "kernel": records[0].kernel, "update_times": records[0].update_times,
                     **result})
    print(f"{'run':<40} {'set':<8} {'n':>3} {'before':>15} {'deconvolved':>13} "
          f"{'+instant':>13} {'+marks':>13} {'+marks+inst':>13} {'rms z':>5} {'floor':>11}")

    def cell(r: dict[str, Any], name: str, kind: str) -> str:
        s = r.get(name, {}).get(kind) if isinstance(r.get(name), dict) else None
        if not s or not s["n"]:
            return "-"
        return f"{s['mean_abs_pct']:.2f}/{s['max_abs_pct']:.2f}"

    for r in rows:
        if "before" not in r:
            continue
        floor = r.get("floor")
        floor_txt = "-" if not floor else f"{floor['mean_abs_pct']:.2f}/{floor['p90_abs_pct']:.2f}"
        for kind in ("marked", "joined", "sliding"):
            n = r["before"][kind]["n"]
            if n:
                z = r.get("breaks+instant", r.get("after"))
                z = z.get("rms_z") if isinstance(z, dict) else None
                print(f"{r['run'][:40]:<40} {kind:<8} {n:>3} {cell(r, 'before', kind):>15} "
                      f"{cell(r, 'after', kind):>13} {cell(r, 'after+instant', kind):>13} "
                      f"{cell(r, 'breaks', kind):>13} {cell(r, 'breaks+instant', kind):>13} "
                      f"{'-' if z is None else f'{z:.2f}':>5} {floor_txt:>11}")
        for name, reason in r["refused"].items():
            print(f"{'':<40} {name}: refused: {reason}")
    write_json("energy_fusion", {"benchmark": "energy_fusion", "machine": machine(),
                                 "sim_runs": args.sim_runs, "sim_duration_s": args.sim_duration,
                                 "rows": rows})
    print(json.dumps({"rows": len(rows)}))


if __name__ == "__main__":
    main()
