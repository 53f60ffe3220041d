"""`wattlab agent`: publish this node's NVML and meters to a recorder on another host."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from wattlab.acquisition.acquirers import amd_options
from wattlab.acquisition.meters import NvmlChoice, amd_acquirers, meter_acquirers
from wattlab.acquisition.session import (
    DEFAULT_CONNECT_TIMEOUT_S,
    WARN_AFTER_S,
    ClockSkew,
    run_agent,
)
from wattlab.arg_types import SEED, SIMULATED_GPUS, InputFile, seconds
from wattlab.commands.record import (
    NVML_INTERVALS_HELP,
    NVML_STREAMS_HELP,
    add_prometheus_option,
    nvml_acquirers,
)
from wattlab.errors import UsageError
from wattlab.sync.bus import ClientSecurity, load_keypair, load_public_key
from wattlab.sync.recorder import StreamMetrics

if TYPE_CHECKING:
    from wattlab.sync.recorder import Exporter

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5560"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "agent", help="publish this node's GPUs and meters to a remote recorder",
        description="Run on a GPU node: read NVML (and --meter devices) and send every "
                    "sample, encrypted and authenticated with CurveZMQ, to a recorder started "
                    "with `wattlab record --listen`. Streams are named <NAME>.<stream>. Stops "
                    "when the recording ends or on Ctrl-C.")
    p.add_argument("--connect", default=DEFAULT_ENDPOINT, metavar="tcp://HOST:PORT",
                   help=f"the recorder's --listen address (default {DEFAULT_ENDPOINT})")
    p.add_argument("--key", required=True, type=InputFile("key file"), metavar="NAME.key_secret",
                   help="this agent's secret key file (from `wattlab keys NAME`); NAME becomes "
                        "the agent's name")
    p.add_argument("--server-key", required=True, type=InputFile("key file"),
                   metavar="RECORDER.key",
                   help="the recorder's public key file")
    p.add_argument("--connect-timeout", type=seconds(), default=DEFAULT_CONNECT_TIMEOUT_S,
                   metavar="S",
                   help="give up (exit 1) if no recorder has answered after S seconds; after "
                        f"{WARN_AFTER_S:g} s the agent says why it has not: key refused, wrong "
                        f"server key, or nothing listening (default {DEFAULT_CONNECT_TIMEOUT_S:g})")
    p.add_argument("--nvml",
                   help="GPUs to read: 'all', a list like '0,1', or 'none' (default: all, or "
                        "none with --amd; with --meter, 'all' on a machine without the NVIDIA "
                        "driver sends no GPU and says so)")
    p.add_argument("--nvml-streams", default="all", metavar="LIST", help=NVML_STREAMS_HELP)
    p.add_argument("--nvml-intervals", default="", metavar="KEY=S,...",
                   help=NVML_INTERVALS_HELP)
    p.add_argument("--simulate", action="store_true",
                   help="use the simulated GPU instead of NVML (no hardware needed)")
    p.add_argument("--simulated-gpus", type=SIMULATED_GPUS, default=1, metavar="N",
                   help="how many simulated GPUs with --simulate (default 1)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the simulated GPU's workload")
    p.add_argument("--meter", action="append", default=[], metavar="[ID=]KIND:ADDRESS",
                   help="an external meter on this node, as for `wattlab record` (repeatable)")
    add_prometheus_option(p)
    p.add_argument("--amd", metavar="all|0,1",
                   help="this node's AMD GPUs through amdsmi, as for `wattlab record`")
    return p


def start_exporter(address: str | None, skew: ClockSkew | None
                   ) -> tuple[StreamMetrics | None, Exporter | None]:
    """The node's streams for Prometheus (``--prometheus``), times on its own clock."""
    if not address:
        return None, None
    from wattlab.sync.recorder import Exporter

    clock_ns = time.monotonic_ns() if skew is None else skew.now_ns()
    metrics = StreamMetrics(time.time_ns() - clock_ns)
    exporter = Exporter(address, metrics)
    print(f"wattlab agent: Prometheus metrics at {exporter.url}", flush=True)
    return metrics, exporter


def run(args: argparse.Namespace) -> int:
    keys = load_keypair(args.key)
    security = ClientSecurity(keys, load_public_key(args.server_key))
    skew = ClockSkew.from_env()
    stop = threading.Event()
    meters = meter_acquirers(args.meter) + amd_acquirers(args.amd, amd_options(
        args.simulate, args.simulated_gpus, args.seed, args.nvml_streams, args.nvml_intervals))
    metrics, exporter = start_exporter(args.prometheus, skew)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in previous:
            signal.signal(s, lambda signum, frame: stop.set())
    try:
        nvml = args.nvml or ("none" if args.amd else "all")
        with nvml_acquirers(NvmlChoice(nvml, args.simulate, args.simulated_gpus,
                                       args.seed, args.nvml_streams, args.nvml_intervals),
                            other_sources=bool(meters)) as gpus:
            acquirers = gpus + meters
            if not acquirers:
                raise UsageError("nothing to publish: no GPU selected (--nvml none) and no meter")
            print(f"wattlab agent {keys.name}: publishing "
                  f"{', '.join(n for n, _ in acquirers)} to {args.connect} once its recorder "
                  "answers", flush=True)
            result = run_agent(args.connect, keys.name, acquirers, security, stop=stop,
                               skew=skew, connect_timeout_s=args.connect_timeout,
                               metrics=metrics,
                               say=lambda line: print(f"wattlab agent {keys.name}: {line}",
                                                      file=sys.stderr, flush=True))
    finally:
        for s, h in (previous or {}).items():
            signal.signal(s, h)
        if exporter is not None:
            exporter.close()
    why = "the recording ended" if result.finished_by_recorder else "stopped"
    print(f"wattlab agent {keys.name}: {why}; streams {', '.join(result.sources)}; "
          f"{result.probes_answered} clock probes answered")
    for name, error in result.source_errors.items():
        print(f"wattlab agent: source {name} failed: {error}", file=sys.stderr)
    return 1 if result.source_errors else (0 if result.finished_by_recorder else 130)
