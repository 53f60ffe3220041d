"""`wattlab qualify`: MLPerf's meter qualification (idle and two loads, Olympic scores).

On a recorded run whose levels are marked (phases ``idle``, ``load1``, ``load2``), or end to
end: ``--simulate`` (simulated GPU, emulated PowerSensor3 on its rails and a wall meter) or
``--gpu I --bench FILE`` drive the levels themselves, record, then score. docs/qualify.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from wattlab.arg_types import GPU_INDEX, SEED, InputFile, Number, OutputFile, seconds
from wattlab.errors import UsageError

if TYPE_CHECKING:
    from wattlab.acquisition.session import SessionResult

SIM_REFERENCE = "ps3:board_power_w"
SIM_TARGETS = ("gpu0.power:average_power_w", "gpu0.power:instant_power_w", "wall:wall_power_w")
SIM_CLASS = "emulated PowerSensor3 (truth known)"
GPU_VIEWS = ("power:average_power_w", "power:instant_power_w")
"""With --gpu and no bench file: the GPU's two NVML power views, scored against its counter."""
COUNTER_CLASS = "none: the GPU's own energy counter"
COUNTER_READ = "energy=0.1"
SIM_CALIBRATION_S = 60.0
LEVEL_MARGIN_S = 1.0
PERCENT = Number(0.0, 100.0)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "qualify", help="qualify meters against a reference as MLPerf's power rules do")
    p.add_argument("run", nargs="*", type=InputFile("run file"),
                   help="a recorded run with phases idle, load1, load2, or several holding "
                        "a level each (recorded in parts; or --simulate/--gpu)")
    p.add_argument("--reference", metavar="SRC[:CH]", help="the reference meter's stream")
    p.add_argument("--target", action="append", default=[], metavar="SRC[:CH]",
                   help="a stream to qualify (repeat for several)")
    p.add_argument("--accuracy-class", metavar="TEXT",
                   help="the reference's accuracy class, as its calibration certificate says")
    p.add_argument("--short", action="store_true",
                   help="five 12 s windows a level instead of five 60 s (CI, quick checks)")
    p.add_argument("--window-s", type=seconds(), metavar="S",
                   help="windows of S s instead of the form's (rehearsals and tests: not a "
                        "qualification by either form)")
    p.add_argument("--max-pct", type=PERCENT, default=5.0, metavar="X",
                   help="pass at x %% or less (default 5, as MLPerf asks)")
    p.add_argument("--calibration", type=InputFile("calibration file"), metavar="CAL.json",
                   help="also score the target it applies to corrected (from another run)")
    p.add_argument("--force-calibration", action="store_true",
                   help="apply a calibration record even if its data could not pin the kernel")
    p.add_argument("--measures", action="append", default=[], metavar="SRC=WHAT",
                   help="what a stream measures where the run's wiring does not say it "
                        "(ps3=gpu0, wall=wall)")
    p.add_argument("--simulate", action="store_true",
                   help="record the levels on a simulated bench first (no hardware); with "
                        "--gpu: the GPU alone, simulated (a rehearsal)")
    p.add_argument("--gpu", type=GPU_INDEX, help="record the levels on this real GPU first")
    p.add_argument("--levels", type=level_list, metavar="L[,L...]",
                   help="with --gpu: record only these levels (idle, load1, load2), to score "
                        "later with the other parts' run files: one level of the full form "
                        "takes ~5 minutes")
    p.add_argument("--bench", type=InputFile("bench file"),
                   help="with --gpu: the bench file of the meters (their wiring); without "
                        "it only the GPU is read, and its energy counter is the reference "
                        "(agreement, not accuracy)")
    p.add_argument("-o", "--output", type=OutputFile("run file"),
                   help="with --simulate/--gpu: run file to create (default qualify-<time>.h5)")
    p.add_argument("--seed", type=SEED, default=7, help="with --simulate: the simulated card")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def level_list(text: str) -> tuple[str, ...]:
    """``idle,load2``: levels of the qualification, each once."""
    from wattlab.analysis.qualify import LEVELS

    names = tuple(n.strip() for n in text.split(","))
    unknown = [n for n in names if n not in LEVELS]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: levels are {', '.join(LEVELS)}, each at most once")
    return names


def _level_s(window_s: float) -> float:
    from wattlab.analysis.qualify import SETTLE_S, WINDOWS_PER_LEVEL

    return SETTLE_S + WINDOWS_PER_LEVEL * window_s + LEVEL_MARGIN_S


def _sim_bench_text(ps3_port: str, wall_resource: str) -> str:
    """The emulated meters' wiring as a bench file says it: the riser feeds GPU 0."""
    return ('[[device]]\nkind = "nvml"\ngpus = "0"\nsimulate = true\n\n'
            f'[[device]]\nkind = "powersensor3"\nid = "ps3"\nport = "{ps3_port}"\n'
            'rails = { 0 = "slot_12v", 1 = "slot_3v3", 2 = "cable_1", 3 = "cable_2" }\n'
            f'gpu = 0\n\n[[device]]\nkind = "wt300e"\nid = "wall"\n'
            f'resource = "{wall_resource}"\nelements = {{ 1 = "wall" }}\n')


def recording_status(result: SessionResult) -> int:
    """1 if the recording lost rows, 0 if none; refused if a source, the load or the disk failed.

    Lost rows are scored all the same: the windows' verdicts say where.

    A frame or two a meter lost while the machine was busy is a gap row the validity
    verdict judges; it used to refuse the whole qualification (bench/qualify.py: one
    0.75 ms hole in the riser's first second of the calibration run).
    """
    from wattlab.commands.record import exit_status, report

    report(result)
    status = exit_status(result)
    failed = (result.source_errors or result.disk_full is not None or result.salvage
              is not None or result.interrupted or result.command_exit_code not in (None, 0))
    if failed:
        raise UsageError(f"{result.output}: the load or a source failed (exit status "
                         f"{status}); not scored")
    return status


def _record_simulated(output: str, schedule: Any, seed: int) -> int:
    """Record the simulated card under ``schedule``, the riser and wall meter wired."""
    from wattlab.acquisition.markers.simulated_phases import SchedulePhaseMarkers
    from wattlab.acquisition.meters import bench_file
    from wattlab.acquisition.session import Session
    from wattlab.hardware.fake_nvml import FakeNvml
    from wattlab.hardware.simulated_gpu import SimulatedGpu
    from wattlab.hardware.virtual_bench import VirtualBench

    bench = VirtualBench(seed, schedule.duration_s)
    bench.gpu = SimulatedGpu(0, seed, schedule)  # before the emulators start: they read it
    bench.nvml = FakeNvml([bench.gpu])
    with bench:
        from wattlab.acquisition.acquirers import Acquirer, NvmlAcquirer
        from wattlab.drivers.nvml import NvmlDriver

        config = bench_file.parse_bench(_sim_bench_text(bench.ps3_port, bench.wall_resource),
                                        "<qualify --simulate>")
        acquirers: list[tuple[str, Acquirer]] = [("gpu0", NvmlAcquirer(NvmlDriver(bench.nvml), 0)),
                     ("phases", SchedulePhaseMarkers(bench.gpu))]
        acquirers += [(d.id, bench_file.meter_acquirer(d)) for d in config.meters]
        result = Session(output, acquirers, duration_s=schedule.duration_s + 0.5,
                         bench_config=config.to_json()).run()
    return recording_status(result)


def _simulate(args: argparse.Namespace, window_s: float, output: str) -> tuple[str | None, int]:
    """Record a calibration run (unless --calibration), then the levels.

    Returns the calibration record's path and 1 if either recording lost rows.
    """
    from wattlab.acquisition.experiments import telegraph
    from wattlab.device_models import Segment, WorkloadSchedule

    stem = os.path.splitext(output)[0]
    cal_path, lost = args.calibration, 0
    if cal_path is None:
        from wattlab.analysis.calibration import calibrate
        from wattlab.runfile import Run

        cal_run, cal_path = f"{stem}-calibration.h5", f"{stem}-calibration.json"
        for path in (cal_run, cal_path):
            if os.path.exists(path):
                raise UsageError(f"{path}: already exists; not overwritten")
        print(f"wattlab qualify: {SIM_CALIBRATION_S:g} s calibration run into {cal_run}")
        lost = _record_simulated(cal_run, telegraph(args.seed, SIM_CALIBRATION_S), args.seed)
        with Run(cal_run) as run_file:
            record = calibrate(run_file, SIM_REFERENCE, SIM_TARGETS[0])
        with open(cal_path, "x", encoding="utf-8") as f:
            json.dump(record.to_json(), f, indent=2)
    level_s = _level_s(window_s)
    schedule = WorkloadSchedule([Segment(1.0, 0.0, "lead-in"), Segment(level_s, 0.0, "idle"),
                                 Segment(level_s, 0.5, "load1"),
                                 Segment(level_s, 1.0, "load2")])
    print(f"wattlab qualify: three levels of {level_s:g} s on a simulated GPU into {output}")
    lost = max(lost, _record_simulated(output, schedule, args.seed))
    return str(cal_path), lost


def _gpu_only_bench(gpu: int, simulate: bool) -> str:
    """The bench file of a machine with no meter: the one GPU, read by NVML.

    Its energy counter is read at every update (0.1 s), not every 9 s: it is the reference,
    so each window's edges are its own readings, not placed by the samples between them.
    """
    text = f'[[device]]\nkind = "nvml"\ngpus = "{gpu}"\nintervals = "{COUNTER_READ}"\n'
    return text + (f"simulate = true\nsimulated_gpus = {gpu + 1}\n" if simulate else "")


def _record_gpu(args: argparse.Namespace, window_s: float, output: str) -> int:
    """Record the levels on a real GPU with the bench file's meters (or none but the GPU).

    A simulated GPU (the bench file's ``simulate = true``: rehearsals, tests) follows its
    own workload, so the levels are only marked there, not driven.
    """
    from wattlab.acquisition.meters import bench_file
    from wattlab.acquisition.session import Session

    config = (bench_file.load_bench(args.bench) if args.bench else
              bench_file.parse_bench(_gpu_only_bench(args.gpu, args.simulate),
                                     "<qualify --gpu>"))
    command = [sys.executable, "-m", "wattlab.acquisition.experiments.qualify_levels_on_gpu",
               "--gpu", str(args.gpu), "--level-s", str(_level_s(window_s))]
    if args.levels:
        command += ["--levels", ",".join(args.levels)]
    if bench_file.nvml_selection(config).simulate:
        command.append("--no-load")
    with bench_file.bench_acquirers(config) as acquirers:
        result = Session(output, acquirers, command=command,
                         bench_config=config.to_json()).run()
    return recording_status(result)


def _check_args(args: argparse.Namespace) -> None:
    modes = sum(bool(x) for x in (args.run, args.simulate and args.gpu is None,
                                  args.gpu is not None))
    if modes != 1:
        raise UsageError("give one of: a run file, --simulate, --gpu I (--gpu I --simulate: "
                         "the GPU alone, simulated)")
    if args.levels and args.gpu is None:
        raise UsageError("--levels is for --gpu I: it records some levels of a qualification "
                         "in parts; score recorded parts by giving their run files")
    if args.gpu is not None and args.simulate and args.bench:
        raise UsageError("--gpu I --simulate reads a simulated GPU alone: a bench file says "
                         "`simulate = true` in its nvml entry instead")
    if args.gpu is not None and not args.bench:
        return  # the GPU alone: its counter and views are the defaults (_defaults)
    if not args.simulate and not (args.reference and args.target and args.accuracy_class):
        raise UsageError("--reference, --target and --accuracy-class are needed (the user "
                         "names the reference and its accuracy class)")
    if args.output and args.run:
        raise UsageError("-o is for --simulate/--gpu: a recorded run is only read")


def _defaults(args: argparse.Namespace) -> tuple[str, list[str], str]:
    """(reference, targets, accuracy class): as given, else the mode's defaults."""
    if args.gpu is not None and not args.bench:
        gpu = f"gpu{args.gpu}"
        return (args.reference or f"{gpu}.energy",
                args.target or [f"{gpu}.{view}" for view in GPU_VIEWS],
                args.accuracy_class or COUNTER_CLASS)
    return (args.reference or SIM_REFERENCE, args.target or list(SIM_TARGETS),
            args.accuracy_class or SIM_CLASS)


def run(args: argparse.Namespace) -> int:
    from wattlab.analysis.calibration import load_record
    from wattlab.analysis.qualify import (
        LEVELS,
        MLPERF_WINDOW_S,
        SHORT_WINDOW_S,
        Procedure,
        parse_measures,
        qualify,
        reference_meaning,
        reference_stream,
    )
    from wattlab.commands.record import default_output
    from wattlab.runfile import Run

    _check_args(args)
    window_s = args.window_s or (SHORT_WINDOW_S if args.short else MLPERF_WINDOW_S)
    form = "custom" if args.window_s else "short" if args.short else "mlperf"
    paths, cal_path, recording_lost = list(args.run), args.calibration, 0
    if not paths:
        paths = [args.output or default_output("qualify")]
        # with --json, stdout is the JSON alone: the recordings' reports go to stderr
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            if args.simulate and args.gpu is None:
                cal_path, recording_lost = _simulate(args, window_s, paths[0])
            else:
                recording_lost = _record_gpu(args, window_s, paths[0])
        if args.levels and len(args.levels) < len(LEVELS):
            print(f"wattlab qualify: level(s) {', '.join(args.levels)} recorded into "
                  f"{paths[0]}; score it with the other levels' run files: wattlab qualify "
                  f"{paths[0]} OTHER.h5 ...", file=sys.stderr)
            if args.json:
                print(json.dumps({"run": paths[0], "recorded_levels": list(args.levels),
                                  "scored": False}))
            return recording_lost
    reference, targets, accuracy = _defaults(args)
    record = load_record(cal_path, force=args.force_calibration) if cal_path else None
    procedure = Procedure(window_s, args.max_pct, told=parse_measures(args.measures))
    with contextlib.ExitStack() as stack:
        runs = [stack.enter_context(Run(path)) for path in paths]
        verdicts = qualify(runs, reference, targets, procedure, record)
        lost = len(runs[0].gaps) if not args.run else 0
        meaning = reference_meaning(*reference_stream(runs[0], reference))
    path = " + ".join(paths)
    doc = {"run": path, "runs": paths, "reference": reference, "accuracy_class": accuracy,
           "meaning": meaning or "accuracy against the reference meter",
           "window_s": window_s, "form": form,
           "max_pct": args.max_pct, "calibration": cal_path,
           "calibration_warnings": list(record.verdict.warnings) if record else [],
           "targets": [v.to_json() for v in verdicts]}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(_text(doc))
    if all(v.refused for v in verdicts):
        return 2
    if lost or recording_lost:  # scored all the same (the windows' verdicts say where)
        print(f"wattlab: {lost} gap(s) in {path}"
              f"{' and its calibration run' if recording_lost and not lost else ''}: data was "
              "lost while recording (exit status 1)", file=sys.stderr)
        return 1
    return 0


def _text(doc: dict[str, Any]) -> str:
    """The verdicts as a person reads them: one block a target."""
    lines = [f"{doc['run']}: qualification against {doc['reference']} "
             f"({doc['accuracy_class']}), {doc['form']} form: five {doc['window_s']:g} s "
             f"windows a level, pass at {doc['max_pct']:g} %",
             f"  what x means: {doc['meaning']}"]
    for warning in doc["calibration_warnings"]:
        lines.append(f"  calibration {doc['calibration']}: {warning}")
    for t in doc["targets"]:
        name = t["target"] + (" corrected" if t["corrected"] else "")
        if t["refused"]:
            lines.append(f"  {name}: REFUSED: {t['refused']}")
            continue
        x = "n/a" if t["x_pct"] is None else f"{t['x_pct']:.2f}{_pm(t['x_pm_pct'])} %"
        lines.append(f"  {name}: x = {x}: {'PASS' if t['passed'] else 'FAIL'}"
                     + ("" if t["valid"] else " (windows not all valid: see below)"))
        for lv in t["levels"]:
            diff = lv["difference_pct"]
            lines.append(f"    {lv['level']:5s} reference {_w(lv['reference_olympic_w'])}  "
                         f"target {_w(lv['target_olympic_w'])}  "
                         + ("n/a" if diff is None
                            else f"{diff:.2f}{_pm(lv['difference_pm_pct'])} %"))
        fine = ", ".join(f"{f['window_s']:g} s: median {_pct(f['median_pct'])}, "
                         f"p95 {_pct(f['p95_pct'])}" for f in t["fine"])
        lines.append(f"    |difference| at {fine}")
        if t["invalid_windows"]:
            lines.append(f"    {len(t['invalid_windows'])} of the scored windows (reference's "
                         f"and target's) failed their validity verdict, e.g. "
                         f"{t['invalid_windows'][0]}")
    return "\n".join(lines)


def _w(value: float | None) -> str:
    return "       - W" if value is None else f"{value:8.2f} W"


def _pm(value: float | None) -> str:
    """' ± v' for a stated ±, nothing where the windows could not give one."""
    return "" if value is None else f" ± {value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} %"
