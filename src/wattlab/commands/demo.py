"""`wattlab demo`: a whole bench with no hardware — simulated GPU under a varying load.

``--serving``: a simulated LLM server on the simulated GPU instead, recorded end to end: the
GPU read through NVML (faked) while the server's counters are scraped from its real local
endpoint (``record --scrape``'s acquirer); the server's request log and truth are written
beside the run, and the log is imported into it where this wattlab has ``import requests``
(docs/scrape.md, "The simulated server").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from wattlab.acquisition.acquirers import Acquirer
from wattlab.acquisition.markers.simulated_phases import SchedulePhaseMarkers
from wattlab.acquisition.meters import ScrapeSource, check_room, nvml_streams
from wattlab.acquisition.session import Session
from wattlab.arg_types import MAX_DEMO_S, SEED, OutputFile, count, seconds
from wattlab.commands.record import (
    add_min_free_option,
    default_output,
    exit_status,
    gap_rows,
    report,
)
from wattlab.errors import UsageError
from wattlab.runfile import DEMO_SEED


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="record a simulated bench (no hardware) and summarise it")
    p.add_argument("-o", "--output", type=OutputFile("run file"),
                   help="run file to create (default: demo-<time>.h5)")
    p.add_argument("--duration", type=seconds(MAX_DEMO_S), default=20.0, metavar="S",
                   help="length of the simulated workload (default 20 s; with --serving the "
                        "requests set it)")
    p.add_argument("--seed", type=SEED, default=11, help="seed of the simulated workload")
    p.add_argument("--serving", action="store_true",
                   help="a simulated LLM server on the simulated GPU instead: staggered "
                        "requests, batching, vLLM's counters scraped from a local endpoint, "
                        "a request log and the truth beside the run (docs/scrape.md)")
    p.add_argument("--requests", type=count(1, 1000), default=60, metavar="N",
                   help="--serving: how many requests (default 60)")
    p.add_argument("--shared", action="store_true",
                   help="a simulated GPU shared by --processes processes instead, each alone "
                        "in turn and then together, recorded with gpu0.processes and the "
                        "truth of each one's energy (docs/processes.md)")
    p.add_argument("--processes", type=count(1, 16), default=3, metavar="N",
                   help="--shared: how many processes (default 3)")
    p.add_argument("--mig", metavar="PROFILES", type=mig_profiles,
                   help="a simulated H100 in MIG mode instead, one process in each GPU "
                        "instance of PROFILES (e.g. 3g.40gb,2g.20gb,2g.20gb), recorded with "
                        "gpu0.mig and the truth of each instance's energy (docs/processes.md)")
    add_min_free_option(p)
    return p


def run(args: argparse.Namespace) -> int:
    from wattlab.acquisition.acquirers import NvmlAcquirer, PowerSensor3Acquirer, Wt300eAcquirer
    from wattlab.drivers.nvml import NvmlDriver
    from wattlab.hardware.virtual_bench import VirtualBench

    if args.serving:
        return run_serving(args)
    if args.shared and args.mig:
        raise UsageError("--shared and --mig are two demos (processes time-sliced, or one in "
                         "each MIG instance): give one")
    if args.shared or args.mig:
        return run_shared(args)
    if args.duration <= 0:
        raise UsageError(f"--duration must be > 0 s, got {args.duration}")
    output = args.output or default_output("demo")
    check_room(output, [*nvml_streams(1, "all"), "powersensor3", "wt300e"], args.duration,
               args.min_free_mb)
    with VirtualBench(args.seed, args.duration) as bench:
        driver = NvmlDriver(bench.nvml)
        acquirers: list[tuple[str, Acquirer]] = [
            ("gpu0", NvmlAcquirer(driver, 0)),
            ("phases", SchedulePhaseMarkers(bench.gpu)),
            ("ps3", PowerSensor3Acquirer(bench.ps3_port, "ps3")),
            ("wall", Wt300eAcquirer(bench.wall_resource, "wall")),
        ]
        print(f"wattlab demo: {args.duration:g} s of a {bench.gpu.model.name} under a "
              f"varying load, measured by NVML, an emulated PowerSensor3 ({bench.ps3_port}) "
              f"and an emulated WT310E ({bench.wall_resource}), into {output}")
        session = Session(output, acquirers, duration_s=args.duration + 0.5,
                          root_attrs={DEMO_SEED: args.seed})
        result = session.run()
    report(result)
    print(f"next: wattlab info {output}")
    # never 0 after losing data: an emulated bench on a busy machine can lose frames; each
    # is a /gaps row, printed above, and exit_status counts them
    status = exit_status(result)
    if lost := gap_rows(output):
        print(f"wattlab: {lost} gap(s) in {output}: data was lost (exit status {status})",
              file=sys.stderr)
    return status


def mig_profiles(text: str) -> list[str]:
    """``--mig``'s comma-separated profiles, checked against an H100's (argparse type)."""
    from wattlab.hardware.shared_gpu import mig_layout

    profiles = [t.strip() for t in text.split(",")]
    try:
        mig_layout(profiles)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return profiles


def run_shared(args: argparse.Namespace) -> int:
    """``demo --shared``/``--mig``: processes sharing one simulated GPU, with their truth."""
    from wattlab.acquisition.acquirers import NvmlAcquirer
    from wattlab.drivers.nvml import NvmlDriver
    from wattlab.hardware.fake_nvml import FakeNvml
    from wattlab.hardware.shared_gpu import IDLE_LEAD_S, mig_simulated_gpu, shared_simulated_gpu

    output = args.output or default_output("shared")
    length_s = IDLE_LEAD_S + args.duration
    check_room(output, nvml_streams(1, "all"), length_s, args.min_free_mb)
    if args.mig:
        gpu = mig_simulated_gpu(args.mig, args.seed, args.duration)
        what, stream = f"one process in each MIG instance ({','.join(args.mig)}) of", "mig"
    else:
        gpu = shared_simulated_gpu(args.processes, args.seed, args.duration)
        what, stream = f"{args.processes} processes sharing", "processes"
    print(f"wattlab demo: {what} a {gpu.model.name} for {args.duration:g} s after "
          f"{IDLE_LEAD_S:g} s idle, into {output}")
    session = Session(output, [("gpu0", NvmlAcquirer(NvmlDriver(FakeNvml([gpu])), 0))],
                      duration_s=length_s + 0.5 - (time.monotonic_ns() - gpu.start_ns) / 1e9,
                      root_attrs={DEMO_SEED: args.seed})
    result = session.run()
    report(result)
    print(f"the truth of each one's energy: the simulated-truth marker of gpu0.{stream} "
          f"(docs/processes.md); next: wattlab info {output}")
    status = exit_status(result)
    if lost := gap_rows(output):
        print(f"wattlab: {lost} gap(s) in {output}: data was lost (exit status {status})",
              file=sys.stderr)
    return status


# idle before the first request: the session starts (recorder, handshake) and the run
# holds idle power to measure before anything is served
SERVING_LEAD_S = 5.0
SERVING_TAIL_S = 1.0


def side_files(output: str) -> tuple[Path, Path]:
    """The request log and the truth, beside the run: ``RUN.requests.jsonl``, ``.truth.json``."""
    stem = Path(output).with_suffix("")
    return Path(f"{stem}.requests.jsonl"), Path(f"{stem}.truth.json")


def run_serving(args: argparse.Namespace) -> int:
    from wattlab.acquisition.acquirers import NvmlAcquirer
    from wattlab.drivers.nvml import NvmlDriver
    from wattlab.hardware.fake_nvml import FakeNvml
    from wattlab.hardware.simulated_server import demo_server

    output = args.output or default_output("serving")
    log_path, truth_path = side_files(output)
    check_room(output, [*nvml_streams(1, "all"), "scrape"], 30.0, args.min_free_mb)
    server = demo_server(args.seed, args.requests, lead_s=SERVING_LEAD_S,
                         tail_s=SERVING_TAIL_S).start()
    try:
        driver = NvmlDriver(FakeNvml([server.gpu]))
        acquirers: list[tuple[str, Acquirer]] = [
            ("gpu0", NvmlAcquirer(driver, 0)),
            ("phases", SchedulePhaseMarkers(server.gpu)),  # idle, serving, idle
            ("scrape", ScrapeSource("scrape", server.url).acquirer())]
        print(f"wattlab demo --serving: {len(server.requests)} requests to a simulated LLM "
              f"server (vLLM's metric names at {server.url}) on a {server.gpu.model.name}, "
              f"{server.plan.duration_s:.1f} s of serving after {SERVING_LEAD_S:g} s idle, "
              f"into {output}")
        started: list[int] = []  # when the workload began: after the first request is late

        def note_start(_: float) -> None:
            if not started:
                started.append(time.monotonic_ns())

        session = Session(output, acquirers, duration_s=server.duration_s + 0.5
                          - (time.monotonic_ns() - server.gpu.start_ns) / 1e9,
                          root_attrs={DEMO_SEED: args.seed},
                          on_progress=note_start)
        result = session.run()
    finally:
        server.stop()
    report(result)
    server.write_request_log(log_path)
    truth = server.write_truth(truth_path)
    status = exit_status(result)
    if started and started[0] > server.serve_start_ns:
        print(f"wattlab: the recording began {(started[0] - server.serve_start_ns) / 1e9:.1f} s "
              "after the first request (a slow start): its figures miss work", file=sys.stderr)
        status = status or 1
    print(f"request log: {log_path}; truth: {truth_path}")
    imported = import_requests(log_path, output)
    if imported == 0:
        serving_summary(output, truth)
    status = imported or status
    print(f"truth: {truth['energy_j']:.0f} J over {truth['serving_span_s']:.1f} s of serving, "
          f"{truth['generation_tokens']} tokens generated: {truth['j_per_token']:.3f} J/token "
          f"({truth['dynamic_j_per_token']:.3f} J/token above idle)")
    print(f"next: wattlab energy {output} --per token; wattlab energy {output} --by-request")
    if lost := gap_rows(output):
        print(f"wattlab: {lost} gap(s) in {output}: data was lost (exit status {status})",
              file=sys.stderr)
    return status


def serving_summary(output: str, truth: dict[str, Any]) -> None:
    """The analysis's J/token and per-request figures beside the simulator's truth."""
    from wattlab.analysis.attribution import energy_by_request, energy_per_unit
    from wattlab.runfile import Run

    with Run(output) as run:
        per_unit = energy_per_unit(run, "token")
        by_request = energy_by_request(run)
    for row in per_unit.rows:
        if row.phase == "serving" and row.j_per_unit is not None:
            pm = row.j_per_unit_pm or 0.0
            print(f"analysis: {row.j_per_unit:.3f} ± {pm:.3f} J/token over the serving phase "
                  f"(truth {truth['j_per_token']:.3f})")
    summary = by_request.summary()
    if summary["j_per_output_token_median"] is not None:
        print(f"analysis: per request {summary['j_per_output_token_median']:.3f} J/output "
              f"token median, {summary['j_per_output_token_p90']:.3f} p90, by the rule "
              f"'{by_request.attribution.rule.name}' (wattlab energy {output} --by-request)")


def import_requests(log_path: Path, output: str) -> int:
    """Import the log into the run where ``wattlab import requests`` exists; else say how.

    Why found through the parser: ``import requests`` is another part of issue 40, and the
    demo uses it the day it exists without a second copy of its checks.
    """
    from wattlab.commands import import_data

    command = f"wattlab import requests {log_path} --into {output}"
    parser = argparse.ArgumentParser(prog="wattlab")
    verb = import_data.add_parser(parser.add_subparsers(dest="verb"))
    formats = [c for a in verb._actions if a.dest == "format" for c in a.choices or ()]
    if "requests" not in formats:
        print(f"next: {command} (once this wattlab can import request logs)")
        return 0
    print(f"$ {command}")
    return import_data.run(parser.parse_args(["import", "requests", str(log_path),
                                              "--into", output]))
