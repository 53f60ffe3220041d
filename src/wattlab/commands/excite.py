"""`wattlab excite`: a calibration load built to identify the driver's kernel, then calibrate.

Records the GPU under a random telegraph of work
(``acquisition/experiments/telegraph_schedule.py``), marking every hold, and calibrates each
NVML power view against the 50 Hz sample buffer at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from wattlab.arg_types import GPU_INDEX, MILLISECONDS, SEED, OutputFile, seconds
from wattlab.errors import UsageError
from wattlab.runfile import EXCITE_SEED

VIEWS = ("average_power_w", "instant_power_w")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "excite", help="run a calibration load on a GPU, record it and calibrate NVML")
    p.add_argument("-o", "--output", type=OutputFile("run file"),
                   help="run file to create (default: excite-<time>.h5)")
    p.add_argument("--gpu", type=GPU_INDEX, default=0, help="GPU index (default 0)")
    p.add_argument("--duration", type=seconds(), default=60.0, metavar="S",
                   help="length of the load (default 60 s)")
    p.add_argument("--seed", type=SEED, default=1, help="seed of the random holds")
    p.add_argument("--min-hold", type=seconds(3600), default=0.1, metavar="S",
                   help="shortest hold at one level (default 0.1 s)")
    p.add_argument("--max-hold", type=seconds(3600), default=3.0, metavar="S",
                   help="longest hold at one level (default 3 s)")
    p.add_argument("--target-se-ms", type=MILLISECONDS, default=5.0, metavar="MS",
                   help="standard error of the kernel width to plan for (default 5 ms)")
    p.add_argument("--simulate", action="store_true",
                   help="the simulated GPU instead of a real one (no hardware, no PyTorch)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _ms(value: dict[str, float | None]) -> str:
    """A value ± its standard error in ms ('not pinned' where the data cannot say)."""
    v, se = value["value"], value["se"]
    text = "-" if v is None else f"{v * 1e3:.1f}"
    return f"{text} ± {se * 1e3:.1f} ms" if se is not None else f"{text} ms (not pinned)"


def _load_command(args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "wattlab.acquisition.experiments.telegraph_on_gpu",
            "--gpu", str(args.gpu),
            "--seed", str(args.seed), "--duration", str(args.duration),
            "--min-hold", str(args.min_hold), "--max-hold", str(args.max_hold)]


def _record(args: argparse.Namespace, output: str) -> Any:
    """The recorded session: the simulated GPU under the telegraph, or a real one running it."""
    from wattlab.acquisition.acquirers import Acquirer
    from wattlab.acquisition.experiments import telegraph
    from wattlab.acquisition.session import Session

    schedule = telegraph(args.seed, args.duration, min_hold_s=args.min_hold,
                         max_hold_s=args.max_hold)  # bad holds fail before anything starts
    if args.simulate:
        from wattlab.acquisition.acquirers import NvmlAcquirer
        from wattlab.acquisition.markers.simulated_phases import SchedulePhaseMarkers
        from wattlab.drivers.nvml import NvmlDriver
        from wattlab.hardware.fake_nvml import FakeNvml
        from wattlab.hardware.simulated_gpu import SimulatedGpu

        gpu = SimulatedGpu(0, args.seed, schedule)
        acquirers: list[tuple[str, Acquirer]] = [
            ("gpu0", NvmlAcquirer(NvmlDriver(FakeNvml([gpu])), 0)),
            ("phases", SchedulePhaseMarkers(gpu))]
        return Session(output, acquirers, duration_s=args.duration + 0.5,
                       root_attrs={EXCITE_SEED: args.seed}).run()
    from wattlab.acquisition.meters import NvmlChoice, nvml_acquirers

    with nvml_acquirers(NvmlChoice(gpus=str(args.gpu))) as acquirers:
        return Session(output, acquirers, command=_load_command(args),
                       root_attrs={EXCITE_SEED: args.seed}).run()


def run(args: argparse.Namespace) -> int:
    from wattlab.acquisition.experiments import seconds_for
    from wattlab.analysis.calibration import calibrate, lead_note, store_in_run
    from wattlab.commands.record import default_output, exit_status
    from wattlab.runfile import Run

    if args.target_se_ms <= 0:
        raise UsageError(f"--target-se-ms must be > 0, got {args.target_se_ms}")
    if args.duration <= 0:
        raise UsageError(f"--duration must be > 0 s, got {args.duration}")
    output = args.output or default_output("excite")
    result = _record(args, output)
    status = exit_status(result)
    if status != 0:
        print(f"wattlab excite: the load or a source failed (status {status}); {output} "
              "holds what was recorded", file=sys.stderr)
        return status
    gpu = "gpu0" if args.simulate else f"gpu{args.gpu}"
    records = []
    with Run(output) as run_file:
        for view in VIEWS:
            records.append(calibrate(run_file, f"{gpu}.samples", f"{gpu}.power:{view}"))
    summary: list[dict[str, Any]] = []
    for record in records:
        store_in_run(output, record)
        width = record.params.width
        need = seconds_for(width.se or float("inf"), args.target_se_ms / 1e3, args.duration)
        summary.append({"view": record.target.channel, "kernel": record.kernel,
                        "identifiable": record.verdict.identifiable, "width_s": width.to_json(),
                        "effective_delay_s": record.effective_delay_s.to_json(),
                        "update_period_s": record.update_period_s,
                        "warnings": list(record.verdict.warnings), "seconds_for_target": need})
    if args.json:
        print(json.dumps({"run": output, "duration_s": args.duration, "views": summary},
                         indent=2))
        return 0
    print(f"wattlab excite: {args.duration:g} s of random holds ({args.min_hold:g}-"
          f"{args.max_hold:g} s) on {gpu}, into {output}")
    for row in summary:
        w, d = row["width_s"], row["effective_delay_s"]
        verdict = "identifiable" if row["identifiable"] else "NOT identifiable"
        print(f"  {row['view']}: {row['kernel']} {_ms(w)}, effective delay {_ms(d)}, "
              "update period "
              f"{row['update_period_s'] * 1e3:.1f} ms: {verdict}")
        note = lead_note(d["value"], d["se"])
        if note is not None:
            print(f"    effective delay {note}")
        for warning in row["warnings"]:
            print(f"    - {warning}")
        need = row["seconds_for_target"]
        if math.isfinite(need) and need > args.duration:
            print(f"    a width to ± {args.target_se_ms:g} ms needs about {need:.0f} s of "
                  "this load")
        elif math.isfinite(need):
            print(f"    the width is already within the ± {args.target_se_ms:g} ms planned for")
    print(f"calibration records stored in {output} (wattlab calibrate shows them in full)")
    return 0
