"""`wattlab record`: start sources and recorder, run the command, print a summary."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from wattlab.acquisition.meters import meter_acquirers, parse_meter_spec
from wattlab.acquisition.session import Session, SessionResult
from wattlab.acquisition.source import Acquirer
from wattlab.acquisition.source_process import SourceSpec
from wattlab.analysis.run_file import Run
from wattlab.analysis.summary import format_table, summarise
from wattlab.errors import NvmlError, UsageError

DEFAULT_LISTEN = "tcp://127.0.0.1:5560"


def default_output(prefix: str) -> str:
    return f"{prefix}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.h5"


def command_of(args: argparse.Namespace) -> list[str]:
    command = list(args.command or [])
    return command[1:] if command[:1] == ["--"] else command


@contextmanager
def nvml_acquirers(
    spec: str, simulate: bool, simulated_gpus: int, seed: int
) -> Iterator[list[tuple[str, Acquirer]]]:
    """NVML (or simulated) acquirers for the GPUs in ``spec``; the library stays open."""
    if spec == "none":
        yield []
        return
    from wattlab.acquisition.nvml_source import NvmlAcquirer
    from wattlab.drivers.nvml import NvmlDriver

    lib = None
    if simulate:
        from wattlab.hardware.fake_nvml import FakeNvml
        from wattlab.hardware.simulated_gpu import simulated_gpus as make_gpus

        if simulated_gpus < 1:
            raise UsageError("--simulated-gpus must be at least 1")
        lib = FakeNvml(make_gpus(simulated_gpus, seed))
    driver = NvmlDriver(lib)
    try:
        driver.open()
    except NvmlError as e:
        raise UsageError(str(e)) from e
    try:
        indices = driver.resolve_gpus(spec)
        yield [(f"gpu{i}", NvmlAcquirer(driver, i)) for i in indices]
    finally:
        driver.close()


def nvml_specs(spec: str, simulate: bool, simulated_gpus: int, seed: int) -> list[SourceSpec]:
    """Source-process specs for the GPUs in ``spec`` (resolved here, read in the children)."""
    with nvml_acquirers(spec, simulate, simulated_gpus, seed) as gpus:
        indices = [int(name.removeprefix("gpu")) for name, _ in gpus]
    return [SourceSpec(f"gpu{i}", "nvml", gpu_index=i, simulate=simulate,
                       simulated_gpus=simulated_gpus, seed=seed) for i in indices]


def meter_specs(texts: list[str]) -> list[SourceSpec]:
    """Source-process specs for every ``--meter`` (checked here so mistakes fail early)."""
    parsed = [parse_meter_spec(t) for t in texts]
    ids = [p.source_id for p in parsed]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise UsageError(f"--meter: stream id(s) {duplicates} used twice; name them ID=KIND:...")
    return [SourceSpec(p.source_id, "meter", meter=t) for p, t in zip(parsed, texts, strict=True)]


def report(result: SessionResult) -> None:
    """Print the per-source summary of a finished session."""
    with Run(result.output) as run:
        print(format_table(summarise(run)))
        gaps = run.gaps
        markers = run.markers
    print(f"run file: {result.output} ({len(markers)} markers, {len(gaps)} gaps)")
    for gap in gaps:
        print(f"  gap in {gap.source}: {gap.reason}")
    for name, error in result.source_errors.items():
        print(f"wattlab: source {name} failed: {error}", file=sys.stderr)
    if result.recorder_restarts:
        print(f"wattlab: the recorder was restarted {result.recorder_restarts} time(s); "
              "see /gaps for anything lost", file=sys.stderr)
    for name, count in result.source_restarts.items():
        print(f"wattlab: source {name} was restarted {count} time(s)", file=sys.stderr)
    rejected = result.recorder_status.get("rejected", 0)
    if rejected:
        print(f"wattlab: the recorder rejected {rejected} malformed message(s): "
              f"{result.recorder_status.get('last_rejection')}", file=sys.stderr)


def exit_status(result: SessionResult) -> int:
    """The command's own status if there was one; 130 after Ctrl-C; 1 if a source failed."""
    code = result.command_exit_code
    if code is not None and code != 0:
        return code if code > 0 else 128 - code  # killed by signal -code, as shells report
    if result.interrupted:
        return 130
    return 1 if result.source_errors else 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "record", help="record meters and NVML while a command runs",
        description="Record every source into a new run file. Put the command to measure "
                    "after '--'; without one, give --duration.")
    p.add_argument("-o", "--output", help="run file to create (default: run-<time>.h5)")
    p.add_argument("--nvml", default="all",
                   help="GPUs to read: 'all', a list like '0,1', or 'none' (default: all)")
    p.add_argument("--simulate", action="store_true",
                   help="use the simulated GPU instead of NVML (no hardware needed)")
    p.add_argument("--simulated-gpus", type=int, default=1, metavar="N",
                   help="how many simulated GPUs with --simulate (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated GPU's workload")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    p.add_argument("--meter", action="append", default=[], metavar="[ID=]KIND:ADDRESS",
                   help="an external meter, e.g. powersensor3:/dev/ttyACM0 or "
                        "wall=wt300e:USB0::0x0B21::0x0025::...::INSTR (repeatable)")
    faults = p.add_argument_group("fault tolerance (see docs/reliability.md)")
    faults.add_argument("--source-processes", action="store_true",
                        help="run each GPU reader and meter in its own process")
    faults.add_argument("--restart-sources", action="store_true",
                        help="restart a source process that dies (implies --source-processes)")
    faults.add_argument("--max-restarts", type=int, default=3, metavar="N",
                        help="restarts allowed per source and for the recorder (default 3)")
    faults.add_argument("--no-restart-recorder", action="store_true",
                        help="end the session if the recorder dies instead of restarting it")
    faults.add_argument("--replay-buffer-mb", type=float, default=64.0, metavar="MB",
                        help="per source: data kept until on disk, resent to a restarted "
                             "recorder (default 64)")
    faults.add_argument("--backlog-mb", type=float, default=32.0, metavar="MB",
                        help="per source: unsent data kept while the recorder is slow or "
                             "away; beyond it batches are dropped and recorded as gaps "
                             "(default 32)")
    remote = p.add_argument_group("remote agents (see `wattlab agent`, `wattlab keys`)")
    remote.add_argument("--listen", nargs="?", const=DEFAULT_LISTEN, metavar="tcp://ADDR:PORT",
                        help=f"accept agents here, CurveZMQ only (default {DEFAULT_LISTEN}: "
                             "loopback; give tcp://0.0.0.0:PORT to accept other hosts)")
    remote.add_argument("--server-key", metavar="NAME.key_secret",
                        help="this recorder's secret key file")
    remote.add_argument("--allow-keys", metavar="DIR",
                        help="folder of the agents' public NAME.key files (only those connect)")
    remote.add_argument("--agent", action="append", default=[], metavar="NAME",
                        help="wait for this agent before the workload starts (repeatable)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def remote_options(args: argparse.Namespace) -> dict[str, Any]:
    """RecorderConfig fields for --listen; keys are checked here so mistakes fail early."""
    if not args.listen:
        if args.agent or args.server_key or args.allow_keys:
            raise UsageError("--agent, --server-key and --allow-keys need --listen")
        return {}
    if not args.server_key or not args.allow_keys:
        raise UsageError("--listen needs --server-key and --allow-keys: the remote bus is "
                         "never open to unknown peers")
    from wattlab.sync.security import load_allowed_keys, load_keypair

    load_keypair(args.server_key)
    names = set(load_allowed_keys(args.allow_keys).values())
    unknown = sorted(set(args.agent) - names)
    if unknown:
        raise UsageError(f"--agent {unknown}: no such key in {args.allow_keys}")
    return {"listen": args.listen, "server_key": args.server_key,
            "allowed_keys": args.allow_keys, "expected_hosts": list(args.agent)}


def fault_options(args: argparse.Namespace) -> dict[str, Any]:
    """Session fields for the fault-tolerance options, checked."""
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    for name in ("replay_buffer_mb", "backlog_mb"):
        value = getattr(args, name)
        if not 0 < value <= 65536:
            raise UsageError(f"--{name.replace('_', '-')} must be in (0, 65536] MB, got {value}")
    return {"restart_sources": args.restart_sources, "max_restarts": args.max_restarts,
            "restart_recorder": not args.no_restart_recorder,
            "window_bytes": int(args.replay_buffer_mb * 2**20),
            "backlog_bytes": int(args.backlog_mb * 2**20)}


def run(args: argparse.Namespace) -> int:
    command = command_of(args)
    if not command and args.duration is None:
        raise UsageError("record needs a command after '--' or --duration S")
    if args.duration is not None and args.duration <= 0:
        raise UsageError(f"--duration must be > 0 s, got {args.duration}")
    output = args.output or default_output("run")
    options = remote_options(args)
    faults = fault_options(args)
    if args.source_processes or args.restart_sources:
        specs = (nvml_specs(args.nvml, args.simulate, args.simulated_gpus, args.seed)
                 + meter_specs(args.meter))
        if not specs and not args.agent:
            raise UsageError("nothing to record: no GPU selected (--nvml none), no meter "
                             "and no --agent")
        session = Session(output, [], command=command or None, duration_s=args.duration,
                          recorder_options=options, source_specs=specs, **faults)
        result = session.run()
        report(result)
        return exit_status(result)
    meters = meter_acquirers(args.meter)
    with nvml_acquirers(args.nvml, args.simulate, args.simulated_gpus, args.seed) as gpus:
        acquirers = gpus + meters
        if not acquirers and not args.agent:
            raise UsageError("nothing to record: no GPU selected (--nvml none), no meter "
                             "and no --agent")
        session = Session(output, acquirers, command=command or None, duration_s=args.duration,
                          recorder_options=options, **faults)
        result = session.run()
    report(result)
    return exit_status(result)
