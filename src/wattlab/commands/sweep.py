"""`wattlab sweep`: run a workload at each power limit / SM clock, record, restore."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from wattlab.acquisition.experiments import (
    KNOB_LABELS,
    RunResult,
    SweepPlan,
    open_driver,
    parse_settings,
    run_sweep,
    runs_folder,
)
from wattlab.analysis.models import (
    PhaseMeasure,
    measure_phases,
    measure_run,
    table_from_runs,
    write_sweep,
)
from wattlab.arg_types import GPU_INDEX, SEED, Number, OutputFile, count, seconds
from wattlab.commands.record import command_of, default_output
from wattlab.errors import UsageError, WattlabError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "sweep", help="run a workload at each power limit, SM or memory clock; record each run",
        description="Apply each setting through NVML (needs root), record the workload, and "
                    "restore the original setting on exit, error, Ctrl-C and SIGTERM. Put the "
                    "command after '--'. With --simulate (or without an NVIDIA driver) the "
                    "simulated GPU is used and, without a command, each run is a fixed amount "
                    "of simulated work.")
    knob = p.add_mutually_exclusive_group(required=True)
    knob.add_argument("--power-limits", metavar="SPEC",
                      help="power limits in W: start:stop:step (stop included) or a,b,c")
    knob.add_argument("--sm-clocks", metavar="SPEC", help="locked SM clocks in MHz")
    knob.add_argument("--mem-clocks", metavar="SPEC",
                      help="locked memory clocks in MHz")
    p.add_argument("--repeat", type=count(1, 1000), default=1, metavar="N", help="runs per setting")
    p.add_argument("--gpu", type=GPU_INDEX, default=0, metavar="I", help="GPU index (default 0)")
    p.add_argument("--simulate", action="store_true", help="use the simulated GPU")
    p.add_argument("--sim-work", type=seconds(3600), default=2.0, metavar="S",
                   help="simulated work per run, in seconds at full clock (default 2)")
    p.add_argument("--sim-utilisation", type=Number(0, 1, above=True), default=1.0, metavar="U",
                   help="utilisation of the simulated workload, 0..1 (default 1)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the simulated GPU")
    p.add_argument("--on-failure", choices=("continue", "stop"), default="continue",
                   help="when the command fails at a setting (default: continue)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("-o", "--output", type=OutputFile("results file"),
                   help="results file to create (default sweep-<time>.h5)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def plan_of(args: argparse.Namespace) -> SweepPlan:
    """The plan from the arguments (validated, nothing touched)."""
    if args.power_limits is not None:
        knob, spec = "power_limit", args.power_limits
    elif args.sm_clocks is not None:
        knob, spec = "sm_clock", args.sm_clocks
    else:
        knob, spec = "mem_clock", args.mem_clocks
    command = command_of(args)
    return SweepPlan(knob, parse_settings(spec, knob), args.repeat, args.gpu, command or None,
                     args.sim_work, args.on_failure)


def run(args: argparse.Namespace) -> int:
    plan = plan_of(args)
    driver, sim_gpu, note = open_driver(args.simulate, plan.gpu, args.seed,
                                        args.sim_utilisation)
    if note:
        print(f"wattlab: {note}", file=sys.stderr)
    try:
        if plan.command is None and sim_gpu is None:
            raise UsageError("sweep needs a command after '--' (or --simulate)")
        if args.dry_run:
            from wattlab.acquisition.experiments import SettingsGuard

            driver.resolve_gpus(str(plan.gpu))
            guard = SettingsGuard(driver, plan.gpu, plan.knob)
            guard.check(plan.settings)
            for line in plan.describe(guard.info.name, guard.describe_original()):
                print(line)
            return 0
        output = args.output or default_output("sweep")
        default_x = max(plan.settings) if plan.knob == "power_limit" else None
        workload = " ".join(plan.command) if plan.command else "simulated"

        phase_cache: dict[str, list[PhaseMeasure]] = {}

        def phases_of(row: RunResult) -> list[PhaseMeasure]:
            """The run's phases (begin/end markers of the workload), measured once."""
            if row.run_file not in phase_cache:
                try:
                    phase_cache[row.run_file] = measure_phases(row.run_file, plan.gpu)
                except (OSError, WattlabError):
                    phase_cache[row.run_file] = []  # an interrupted run may have no file
            return phase_cache[row.run_file]

        def save(rows: list[RunResult], attrs: dict[str, Any]) -> None:
            table = table_from_runs(plan.x_name, workload, [asdict(r) for r in rows], default_x,
                                    phases=[phases_of(r) for r in rows])
            write_sweep(output, table, attrs)

        def log(line: str) -> None:
            print(line, flush=True)

        outcome = run_sweep(plan, driver, output, measure=measure_run, save=save,
                            sim_gpu=sim_gpu, log=log)
    finally:
        driver.close()
    label, unit = KNOB_LABELS[plan.knob]
    print(f"restored: {json.dumps(outcome.restored)}", flush=True)
    print(f"results: {outcome.output} ({len(outcome.rows)} runs; run files in "
          f"{runs_folder(outcome.output)})")
    if outcome.interrupted:
        print("wattlab: sweep interrupted; the original setting was restored", file=sys.stderr)
        return 130
    failed = [r for r in outcome.rows if r.status != "ok"]
    if failed:
        print(f"wattlab: the workload failed at {len(failed)} run(s): "
              + ", ".join(f"{label} {r.x:g} {unit}" for r in failed), file=sys.stderr)
        return 1
    return 0
