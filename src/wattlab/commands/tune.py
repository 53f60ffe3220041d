"""`wattlab tune`: record a training job while tuning the GPU's clocks and power limit."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from wattlab.acquisition.experiments import open_driver
from wattlab.arg_types import GPU_INDEX, RECORD_S, SEED, OutputFile, count, finite
from wattlab.commands.record import command_of, default_output, exit_status, report
from wattlab.errors import UsageError
from wattlab.tuning.guards import KNOBS
from wattlab.tuning.online import TunePlan, may_change, run_tune, tune_axes
from wattlab.tuning.search import OBJECTIVES, SearchConfig


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "tune", help="tune SM clock, memory clock and power limit while a job trains",
        description="Record the command (as `wattlab record` does), find its iterations in "
                    "the GPU's power, measure energy and time per iteration at each setting "
                    "tried, and keep the setting with the lowest energy (or EDP) within "
                    "--max-slowdown for the rest of the run. Every probe and decision goes "
                    "to /analysis/tuning in the run file; the original settings are "
                    "restored on every exit. Changing settings needs root: without it (or "
                    "with --dry-run) it only measures and says what it would set.")
    p.add_argument("-o", "--output", type=OutputFile("run file"),
                   help="run file to create (default: tune-<time>.h5)")
    p.add_argument("--objective", default="energy",
                   help=f"what to minimise: {' or '.join(OBJECTIVES)} (default energy)")
    # the fraction's own rule, [0, 1], is SearchConfig.check's (the API's too)
    p.add_argument("--max-slowdown", type=finite(), default=0.05, metavar="FRAC",
                   help="time per iteration allowed above the default's, as a fraction "
                        "(default 0.05 = 5 %%)")
    p.add_argument("--knobs", default="sm_clock,power_limit", metavar="LIST",
                   help=f"comma list of {', '.join(KNOBS)} to tune, searched in this order "
                        "(default sm_clock,power_limit)")
    p.add_argument("--gpu", type=GPU_INDEX, default=0, metavar="I", help="GPU index (default 0)")
    p.add_argument("--min-iters", type=count(0), default=5, metavar="N",
                   help="iterations measured at least per setting (default 5)")
    p.add_argument("--max-iters", type=count(0), default=500, metavar="N",
                   help="iterations measured at most per setting (default 500; most "
                        "settings end far sooner, see docs/tune.md)")
    p.add_argument("--expected-iterations", type=count(0), metavar="N",
                   help="the run's length in iterations, if known: exploring is capped at "
                        "4.8 %% of the whole run's energy (without it, of the energy so far)")
    p.add_argument("--no-trials", action="store_true",
                   help="never run a not yet certified challenger in the kept setting's "
                        "place (trials, docs/tune.md)")
    p.add_argument("--step-marker", metavar="NAME",
                   help="take iterations from the workload's markers of this name (begin or "
                        "point, e.g. from wattlab.mark) instead of the power samples")
    p.add_argument("--auto-markers", action="store_true",
                   help="a Python workload gets phase markers from its framework (as in "
                        "`wattlab record`)")
    p.add_argument("--dry-run", action="store_true",
                   help="measure and report what it would set; change nothing")
    p.add_argument("--simulate", action="store_true",
                   help="tune the simulated GPU running a simulated training loop")
    p.add_argument("--duration", type=RECORD_S, metavar="S",
                   help="with --simulate and no command: record for S seconds")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the simulated GPU")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def plan_of(args: argparse.Namespace) -> TunePlan:
    """The validated plan (nothing touched yet)."""
    knobs = [k.strip() for k in args.knobs.split(",") if k.strip()]
    unknown = [k for k in knobs if k not in KNOBS]
    if unknown or not knobs:
        raise UsageError(f"--knobs {args.knobs!r}: unknown knob(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(KNOBS)}")
    config = SearchConfig(objective=args.objective, max_slowdown=args.max_slowdown,
                          min_iters=args.min_iters, max_iters=args.max_iters,
                          expected_iterations=args.expected_iterations,
                          trial_gain=None if args.no_trials else SearchConfig.trial_gain)
    config.check()
    command = command_of(args) or None
    if command is None and args.duration is None:
        raise UsageError("tune needs a command after '--' (or --duration S with --simulate)")
    if args.step_marker is not None and not args.step_marker.strip():
        raise UsageError("--step-marker needs a marker name")
    return TunePlan(list(dict.fromkeys(knobs)), config, args.gpu, args.dry_run, command,
                    args.duration, step_marker=args.step_marker,
                    auto_markers=args.auto_markers)


def simulated_training(seed: int) -> Any:
    """Steps of 150 ms busy then 50 ms of data loading, repeated: a training loop's power."""
    from wattlab.device_models import Segment, WorkloadSchedule

    return WorkloadSchedule([Segment(0.15, 1.0, "step"), Segment(0.05, 0.05, "load")],
                            repeat=True)


def driver_on_surface(response: Any, seed: int = 0) -> tuple[Any, Any]:
    """(driver, simulated GPU) whose training loop follows a published surface.

    ``response`` is a SettingResponse (``Surface.response()``): each iteration of the loop
    takes the time and energy the surface says at the setting in force, so what tune
    measures can be checked against the surface (tests, bench/tune_simulate.py).
    """
    from wattlab.drivers.nvml import NvmlDriver
    from wattlab.hardware.fake_nvml import FakeNvml
    from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu

    gpu = SimulatedGpu(seed=seed, schedule=simulated_training(seed),
                       model=GpuModel.following(response))
    driver = NvmlDriver(FakeNvml([gpu]))
    driver.open()
    return driver, gpu


def dry_run_lines(s: dict[str, Any], iterations: int) -> list[str]:
    """What a dry run found, what comes next, and what is worth asking an administrator for.

    Why: a dry run that ended before the default was measured used to say "the search
    would next try null"; and a user without root needs to know what to ask for.
    """
    e, _, t, _ = s["baseline"]
    lines = [f"dry run: {iterations} iterations from {s['iteration_source']}; at the current "
             f"setting {json.dumps(s['default'])}: {e:.3f} J and {t * 1e3:.1f} ms per "
             f"iteration; nothing was changed; controller CPU {s['controller_cpu_s']:.2f} s"]
    if s["would_apply_next"] is None:
        lines.append(
            "the default was still being measured when the run ended "
            f"({s['baseline_iterations']} iterations of the at least "
            f"{s['config']['min_iters']} it needs, more while its spread is wide): no other "
            "setting was chosen yet; run longer (--duration, or a longer job) to learn it")
    else:
        lines.append(f"the search would next try {json.dumps(s['would_apply_next'])}")
    lines.append(
        "worth asking for: only the current setting was measured, so no setting or saving "
        "can be predicted for this job (a prediction, fit --sparse in docs/sweeps.md, needs "
        "the job measured at 2 or more settings of one knob beside other workloads swept on "
        "the same GPU model); ask the administrator to run `wattlab tune` with the right to "
        "change settings, or a short `wattlab sweep` of this job, then `wattlab fit --sparse`")
    return lines


def run(args: argparse.Namespace) -> int:
    plan = plan_of(args)
    driver, _, note = open_driver(args.simulate, plan.gpu, args.seed,
                                  schedule=simulated_training(args.seed) if args.simulate
                                  else None)
    if note:
        driver.close()
        raise UsageError(f"{note.split(':')[0]}: tune changes a real GPU's settings; use "
                         "--simulate to try it on the simulated GPU")
    try:
        if not plan.dry_run:
            guards, _ = tune_axes(driver, plan)
            why = may_change(driver, guards)
            if why is not None:
                print(f"wattlab: settings cannot be changed here ({why}): measuring only "
                      "(--dry-run)", file=sys.stderr)
                plan.dry_run = True
        output = args.output or default_output("tune")
        outcome = run_tune(plan, driver, output, simulate=args.simulate)
    finally:
        driver.close()
    report(outcome.session)
    s = outcome.summary
    if outcome.dry_run:
        print("\n".join(dry_run_lines(s, outcome.iterations)))
        return exit_status(outcome.session)
    print(f"tune ({s['objective']}, max slowdown {s['max_slowdown']:.1%}): "
          f"{outcome.iterations} iterations from {s['iteration_source']}; "
          f"{s['probes']} setting(s) measured; controller CPU {s['controller_cpu_s']:.2f} s")
    print(f"kept: {json.dumps(s['chosen'])} (default {json.dumps(s['default'])}): "
          f"measured energy {-s['energy_saving_measured']:+.1%} ± "
          f"{s['energy_saving_se']:.1%}, time {s['slowdown_measured']:+.1%} ± "
          f"{s['slowdown_se']:.1%} per iteration (± one standard error)"
          + ("" if s["settled"] else " - the search had not finished when the run ended"))
    if s["trial"] is not None:
        print(f"on trial when the run ended: {json.dumps(s['trial'])} (ran in place of the "
              "kept setting; its slowdown was not yet certified within the bound)")
    if not outcome.dry_run:
        print(f"restored: {json.dumps(outcome.restored)}")
    return exit_status(outcome.session)
