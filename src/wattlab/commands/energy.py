"""`wattlab energy RUN [--by-marker] [--window T0:T1] [--json]`: joules per phase.

``--per UNIT`` gives joules per unit of work (a counter), ``--by-request`` each request's
joules (docs/serving.md); both through ``wattlab.analysis.attribution``.

``--calibration cal.json`` corrects NVML energy with a record from `wattlab calibrate`;
``--deconvolve`` does it by deconvolving the record's windows (``energy_fusion``).
"""

from __future__ import annotations

import argparse
import json
import math
from functools import partial
from typing import TYPE_CHECKING, Any

from wattlab.analysis.many_runs import (
    add_runs_arguments,
    expand_runs,
    json_item,
    json_list,
    map_runs,
    report_errors,
)
from wattlab.arg_types import InputFile, Number, non_empty_name
from wattlab.errors import UsageError

if TYPE_CHECKING:  # the parser is built without importing the run-file format
    from wattlab.runfile import CalibrationRecord


def window_s(text: str) -> tuple[float, float]:
    """'T0:T1' as two finite seconds."""
    start, sep, end = text.partition(":")
    try:
        t0_s, t1_s = float(start), float(end)
    except ValueError:
        t0_s = t1_s = math.nan
    if not sep or not (math.isfinite(t0_s) and math.isfinite(t1_s)):
        raise argparse.ArgumentTypeError(f"{text!r} is not START:END in seconds, e.g. 12.5:40")
    return t0_s, t1_s  # the order is energy_report's to check, for the API too


def charge_parts(text: str) -> tuple[str, ...]:
    """'static,idle' as the parts named (each once, each known)."""
    parts = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in parts if t not in ("static", "idle")]
    if bad or not parts:
        raise argparse.ArgumentTypeError(f"{text!r}: name static, idle or static,idle")
    return parts


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "energy", help="energy and mean power per source and phase, with intervals")
    add_runs_arguments(p)
    p.add_argument("--by-marker", action="store_true",
                   help="also one row per phase (begin/end markers)")
    p.add_argument("--window", action="append", default=[], type=window_s, metavar="T0:T1",
                   help="also one row for this span, seconds since the session start "
                        "(repeatable)")
    p.add_argument("--reference", metavar="SRC[:CHANNEL]",
                   help="stream the errors are relative to (default: the first non-NVML meter)")
    p.add_argument("--calibration", metavar="CAL.json", type=InputFile("calibration file"),
                   action="append", default=[],
                   help="correct NVML energy with a record from `wattlab calibrate -o` "
                        "(with --deconvolve, again for the instant reading's record)")
    p.add_argument("--deconvolve", action="store_true",
                   help="correct by deconvolving the 1 s average's overlapping windows on "
                        "its update lattice (the first --calibration; docs/energy_fusion.md)")
    p.add_argument("--steps-at-marks", action="store_true",
                   help="with --deconvolve: let the power step freely at every marker's "
                        "time (phase begins and ends) instead of smoothing across it")
    p.add_argument("--force-calibration", action="store_true",
                   help="apply a calibration record even if its data could not pin the kernel")
    p.add_argument("--node", action="store_true",
                   help="split the run into each node's GPU, CPU, DRAM and wall energy, each "
                        "joule once, with what is unmeasured and the job total "
                        "(docs/node-energy.md)")
    p.add_argument("--wall", metavar="SRC[:CHANNEL]",
                   help="with --node: the stream that measures the node's AC power (default: "
                        "a stream named wall)")
    p.add_argument("--per", metavar="UNIT", type=non_empty_name,
                   help="joules per unit of work over the run and per phase: tokens, requests, "
                        "samples or a counter's name (docs/serving.md)")
    p.add_argument("--by-request", action="store_true",
                   help="each request's energy, prefill and decode apart, from the table "
                        "`wattlab import requests` added (docs/serving.md)")
    for flag, what in (("process", "each process's energy on each GPU"),
                       ("job", "each Slurm job's (its processes summed)"),
                       ("pod", "each Kubernetes pod's (its processes summed)"),
                       ("instance", "each MIG instance's energy on each MIG GPU (from the "
                                    "per-instance stream)")):
        p.add_argument(f"--by-{flag}", action="store_true",
                       help=f"{what}, from the per-process stream, idle and static apart "
                            "(docs/process-energy.md)")
    p.add_argument("--rule", choices=("activity", "utilisation", "alone", "in-flight"),
                   default=None,
                   help="with --by-process/-job/-pod: how dynamic energy is split: activity "
                        "(weights fitted on the run itself; default) or utilisation "
                        "(Kepler's SM share); with --by-request: alone (by each request's "
                        "predicted alone energy; default) or in-flight (each interval among "
                        "the requests in flight then)")
    p.add_argument("--charge", type=charge_parts, default=None, metavar="PARTS",
                   help="with --by-process/-job/-pod: shared parts charged to the processes "
                        "(static, idle or static,idle; default: neither, own rows)")
    p.add_argument("--idle-w", type=Number(0.0, 1e5, unit="W"), metavar="W",
                   help="with --per or --by-request: the idle power (default: measured where "
                        "no work ran)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any figure fails a validity check (docs/validity.md); "
                        "without it an invalid figure is marked and the exit status is 0")
    return p


def verdict_status(reports: list[dict[str, Any]], strict: bool) -> int:
    """1 under --strict where some report holds an invalid figure, else 0."""
    return int(strict and not all(r["valid"] for r in reports))


def report_of(path: str, options: dict[str, Any], records: list[CalibrationRecord],
              deconvolve: bool = False, *, force: bool = False, steps_at_marks: bool = False
              ) -> dict[str, Any]:
    """One file's energy report (a worker's job when there are several files)."""
    # imported here: every verb's module is imported to build the parser, and its
    # dependencies (scipy) would otherwise cost every `wattlab` command their start-up time
    from wattlab.analysis.energy import energy_report
    from wattlab.runfile import Run

    with Run(path) as run_file:
        fusion = None
        if deconvolve:
            from wattlab.analysis.calibration import fuse_records, mark_breaks

            fusion = fuse_records(run_file, records, force=force,
                                  breaks_s=mark_breaks(run_file) if steps_at_marks else ())
        return energy_report(run_file, calibration=records[0] if records else None,
                             fusion=fusion, **options)


def run(args: argparse.Namespace) -> int:
    from wattlab.analysis.energy import format_report

    if args.node or args.wall:
        return node_run(args)
    if args.by_request:
        return attribution_run(args)
    if args.rule and not args.by_request:
        from wattlab.analysis.attribution import REQUEST_RULES

        if args.rule in REQUEST_RULES:
            raise UsageError(f"--rule {args.rule} shares requests: it goes with --by-request")
    if (args.by_process or args.by_job or args.by_pod or args.by_instance or args.rule
            or args.charge):
        return process_run(args)
    if args.per or args.by_request or args.idle_w is not None:
        return attribution_run(args)
    if args.deconvolve and not args.calibration:
        raise UsageError("--deconvolve needs --calibration: the record of the 1 s average")
    if args.steps_at_marks and not args.deconvolve:
        raise UsageError("--steps-at-marks shapes the deconvolution: give --deconvolve too")
    if len(args.calibration) > 1 and not args.deconvolve:
        raise UsageError("a second --calibration is only for --deconvolve (the instant's)")
    records = []
    if args.calibration:  # only then: its fitting modules cost every run ~15 ms to import
        from wattlab.analysis.calibration import load_record

        records = [load_record(path, force=args.force_calibration) for path in args.calibration]
    options = {"by_marker": args.by_marker, "reference": args.reference, "windows": args.window}
    one = partial(report_of, options=options, records=records, deconvolve=args.deconvolve,
                  force=args.force_calibration, steps_at_marks=args.steps_at_marks)
    paths = expand_runs(args.runs)
    if len(paths) == 1:
        report = one(paths[0])
        print(json.dumps(report, indent=2) if args.json else format_report(report))
        return verdict_status([report], args.strict)
    outcomes = []
    for outcome in map_runs(partial(json_item, one) if args.json else one, paths, args.jobs):
        outcomes.append(outcome)
        if outcome.error or args.json:
            continue
        print(f"== {outcome.path}")
        print(format_report(outcome.result))
    if args.json:  # each report encoded in its worker
        print(json_list([o.result for o in outcomes if not o.error]))
    # parsed back only under --strict: each item is the worker's encoded report
    reports = [json.loads(o.result) if args.json else o.result for o in outcomes
               if not o.error and args.strict]
    return report_errors(outcomes) or verdict_status(reports, args.strict)


def node_run(args: argparse.Namespace) -> int:
    """``--node``: the node split instead of the per-stream table."""
    from wattlab.analysis.energy import format_node_report, node_report
    from wattlab.runfile import Run

    if not args.node:
        raise UsageError("--wall needs --node")
    paths = expand_runs(args.runs)
    if len(paths) != 1:
        raise UsageError(f"--node reads one run file (it covers every node in it), got "
                         f"{len(paths)}")
    if (args.by_marker or args.window or args.calibration or args.reference or args.deconvolve
            or args.steps_at_marks):
        raise UsageError("--node covers the whole run: drop --by-marker, --window, "
                         "--reference, --calibration and --deconvolve")
    with Run(paths[0]) as run_file:
        report = node_report(run_file, wall=args.wall)
    print(json.dumps(report, indent=2) if args.json else format_node_report(report))
    return verdict_status([report], args.strict)


def attribution_run(args: argparse.Namespace) -> int:
    """``--per UNIT`` or ``--by-request``: one run's energy shared by work done."""
    from wattlab.analysis.attribution import (
        energy_by_request,
        energy_per_unit,
        format_by_request,
        format_per_unit,
    )
    from wattlab.runfile import Run

    if args.by_request and (args.by_process or args.by_job or args.by_pod or args.charge):
        raise UsageError("--by-request goes alone: drop --by-process, --by-job, --by-pod, "
                         "--charge")
    if bool(args.per) == args.by_request:
        raise UsageError("give one of --per UNIT and --by-request" if args.per else
                         "--idle-w goes with --per UNIT or --by-request")
    paths = expand_runs(args.runs)
    if len(paths) != 1:
        raise UsageError(f"--per and --by-request read one run file, got {len(paths)}")
    if (args.node or args.by_marker or args.window or args.calibration or args.reference
            or args.deconvolve):
        raise UsageError("--per and --by-request use the run's chosen stream and its phases: "
                         "drop --by-marker, --window, --reference, --calibration, --deconvolve")
    with Run(paths[0]) as run_file:
        if args.per:
            per = energy_per_unit(run_file, args.per, idle_w=args.idle_w)
            report, text, valid = per.to_json(), format_per_unit(per), per.valid
        else:
            split = energy_by_request(run_file, idle_w=args.idle_w,
                                      **({"rule": args.rule} if args.rule else {}))
            report, text, valid = split.to_json(), format_by_request(split), split.stream.valid
    print(json.dumps(report, indent=2) if args.json else text)
    return int(args.strict and not valid)


def process_run(args: argparse.Namespace) -> int:
    """``--by-process``/``-job``/``-pod``/``-instance``: each one's share of its GPU's energy."""
    from wattlab.analysis.attribution import by_process_json, energy_by_process, format_by_process
    from wattlab.runfile import Run

    by = [g for g in ("process", "job", "pod", "instance") if getattr(args, f"by_{g}")]
    if len(by) != 1:
        raise UsageError("--rule and --charge go with one of --by-process, --by-job, --by-pod, "
                         "--by-instance" if not by else f"give one of --by-{' and --by-'.join(by)}")
    paths = expand_runs(args.runs)
    if len(paths) != 1:
        raise UsageError(f"--by-{by[0]} reads one run file, got {len(paths)}")
    if (args.node or args.by_marker or args.window or args.calibration or args.reference
            or args.deconvolve or args.per or args.by_request or args.idle_w is not None):
        raise UsageError(f"--by-{by[0]} splits the run's energy on each GPU's own streams: drop "
                         "--by-marker, --window, --reference, --calibration, --deconvolve, "
                         "--per, --by-request, --idle-w")
    with Run(paths[0]) as run_file:
        result = energy_by_process(run_file, rule=args.rule or "activity",
                                   charge=args.charge or (),
                                   unit={"instance": "instance", "process": "process"}.get(
                                       by[0], "auto"))  # a job's or pod's: MIG's too
    group = "process" if by[0] == "instance" else by[0]  # an instance is a row of its own
    print(json.dumps(by_process_json(result, group), indent=2) if args.json
          else format_by_process(result, group))
    return int(args.strict and not result.valid)
