"""`wattlab calibrate RUN --reference SRC[:CH] --target SRC[:CH]`: how wrong is NVML."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from wattlab.arg_types import GRID_RATE, InputFile, OutputFile, seconds

if TYPE_CHECKING:  # the parser is built without importing the run-file format
    from wattlab.runfile import Estimate


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "calibrate", help="fit lag, smoothing, gain and offset of a GPU power reading")
    p.add_argument("run", type=InputFile("run file"), help="run file")
    p.add_argument("--reference", required=True, metavar="SRC[:CHANNEL]",
                   help="the trusted stream (external meter, or NVML's 50 Hz samples)")
    p.add_argument("--target", required=True, metavar="SRC[:CHANNEL]",
                   help="the stream to calibrate (e.g. gpu0.power:average_power_w)")
    p.add_argument("-o", "--output", type=OutputFile("calibration file"),
                   help="write the calibration record (JSON) here")
    p.add_argument("--json", action="store_true", help="print the whole record as JSON")
    p.add_argument("--no-store", action="store_true",
                   help="do not add the record to the run under /analysis/calibration")
    p.add_argument("--grid-rate", type=GRID_RATE, default=1000.0, metavar="HZ",
                   help="resolution of the reference grid (default 1000 Hz)")
    p.add_argument("--min-phase", type=seconds(zero=True), default=2.0, metavar="S",
                   help="phases shorter than this are left out of the error summary")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any figure fails a validity check (docs/validity.md); "
                        "without it an invalid figure is marked and the exit status is 0")
    return p


def _fmt(obj: Estimate, unit: str, scale: float = 1.0) -> str:
    v, se = obj.value, obj.se
    if v is None:
        return "-"
    return f"{v * scale:.4g} ± {se * scale:.2g} {unit}" if se is not None else \
        f"{v * scale:.4g} {unit} (not pinned by this data)"


def _sign_note(delay: Estimate) -> None:
    """Under a delay below 0, what it means (the kernels are causal)."""
    from wattlab.analysis.calibration import lead_note


    note = lead_note(delay.value, delay.se)
    if note is not None:
        print(f"                  ({note})")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: building the parser imports every verb's module
    from wattlab.analysis.calibration import calibrate, store_in_run
    from wattlab.runfile import Run

    with Run(args.run) as run_file:
        record = calibrate(run_file, args.reference, args.target, grid_rate_hz=args.grid_rate,
                           min_phase_s=args.min_phase)
    stored = None if args.no_store else store_in_run(args.run, record)
    doc = record.to_json()
    if args.output:
        with open(args.output, "x", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    status = int(args.strict and record.validity is not None and not record.validity.valid)
    if args.json:
        print(json.dumps(doc, indent=2))
        return status
    key, verdict = record.key, record.verdict
    print(f"{record.where} vs {record.reference.source}:{record.reference.channel}")
    print(f"  GPU {key.gpu_model}, board {key.board or '-'}, driver "
          f"{key.driver_version or '-'}, field {key.nvml_field}")
    if not verdict.identifiable:
        print("  NOT IDENTIFIABLE: this recording cannot pin the driver's kernel")
        for warning in verdict.warnings:
            print(f"    - {warning}")
        print(f"    fix: {verdict.advice}")
        print("    `wattlab energy --calibration` refuses this record unless "
              "--force-calibration is given")
    print(f"  kernel          {record.kernel}  ({record.convention})")
    for name, value in record.params.by_name().items():
        unit = "ms" if name.endswith("_s") else ("W" if name.endswith("_w") else "")
        print(f"  {name:<15} {_fmt(value, unit, 1e3 if unit == 'ms' else 1.0)}")
        if unit == "ms":
            _sign_note(value)
    print(f"  effective delay {_fmt(record.effective_delay_s, 'ms', 1e3)}")
    _sign_note(record.effective_delay_s)
    period_se = record.update_period_se_s
    print(f"  update period   {record.update_period_s * 1e3:.1f}"
          + (f" ± {period_se * 1e3:.2f}" if period_se is not None else "") + " ms, coverage "
          f"{record.coverage * 100:.0f} %")
    fit = record.fit
    print(f"  residual        {fit.rmse_w:.2f} W rms (R² {fit.r2:.4f}, "
          f"{fit.n_points} readings)")
    pdg = record.power_dependent_gain
    print(f"  power-dependent gain slope {_fmt(pdg.slope, '')}: "
          f"{'warranted' if pdg.warranted else 'not warranted'}")
    e = record.energy
    if e.overall:
        o = e.overall
        print(f"  energy overall  {o.error_before_pct:+.2f} % before, "
              f"{o.error_after_pct:+.2f} % after correction")
    if e.by_length:
        print("  energy error by phase length (rms over sliding windows, after correction): "
              + ", ".join(f"{row.length_s:g} s {row.rms_error_after_pct:.2f} %"
                          for row in e.by_length if row.rms_error_after_pct is not None))
    if e.phases_considered:
        print(f"  phases ≥ {e.min_phase_s:g} s ({e.phases_considered}): mean |error| "
              f"{e.mean_abs_error_before_pct:.2f} % before, "
              f"{e.mean_abs_error_after_pct:.2f} % after")
    _validity_lines(doc)
    if stored:
        print(f"  stored in {args.run}:{stored}")
    if args.output:
        print(f"  record written to {args.output}")
    return status


def _validity_lines(doc: dict[str, Any]) -> None:
    """Whether every figure above passed the validity checks; each one that did not, why."""
    from wattlab.analysis.energy import invalid_reasons

    validity = doc["validity"]
    figures = validity["figures"]
    if validity["valid"]:
        print(f"  valid           all {len(figures)} figures (parameters, overall, phases, "
              "summary) pass the validity checks (docs/validity.md)")
    else:
        print(f"  INVALID         {validity['invalid_figures']} of {len(figures)} figures fail "
              "a validity check (docs/validity.md):")
    for figure in figures:
        if not figure["valid"]:
            for why in invalid_reasons(figure):
                print(f"    {figure['figure']}: {why}")
    for phase in validity["left_out"]:
        for why in invalid_reasons(phase):
            print(f"  no figure       {phase['figure']}: {why}")
