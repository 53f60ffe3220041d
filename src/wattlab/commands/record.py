"""`wattlab record`: start sources and recorder, run the command, print a summary.

The sources come from flags (``--nvml``, ``--simulate``, ``--meter``) or from a bench file
(``--bench``), whose validated content is kept in the run's ``bench_config`` attribute.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from wattlab.acquisition.acquirers import (
    DEFAULT_INTERVALS_S,
    FRUGAL_INTERVALS,
    MAX_DRAIN_S,
    NvmlAcquirer,
    amd_devices,
    amd_options,
)
from wattlab.acquisition.meters import (
    BenchConfig,
    DeviceConfig,
    NvmlChoice,
    add_scrape_options,
    amd_acquirers,
    bench_acquirers,
    check_gpus_exist,
    check_room,
    check_unique_ids,
    load_bench,
    meter_acquirers,
    meter_options_json,
    nvml_acquirers,
    nvml_selection,
    nvml_streams,
    parse_meter_spec,
    scrape_sources,
)
from wattlab.acquisition.session import (
    STOP_TIMEOUT_S,
    Session,
    SessionResult,
    SourceSpec,
    live_panel,
)
from wattlab.analysis.energy import (
    SourceSummary,
    format_table,
    summarise,
    wiring_mismatches,
)
from wattlab.arg_types import (
    BUFFER_MB,
    MAX_SIMULATED_GPUS,
    RECORD_S,
    SEED,
    Folder,
    InputFile,
    Number,
)
from wattlab.errors import UsageError, WattlabError
from wattlab.runfile import RECORDER_STATUS_JSON, GapRow, Run
from wattlab.sync.recorder import DiskFullReport

DEFAULT_LISTEN = "tcp://127.0.0.1:5560"
MAX_STOP_TIMEOUT_S = 3600.0
MAX_SHARED_PROCESSES = 16  # each one's truth goes in one marker of at most 2 kB
NVML_STREAMS_HELP = (
    "NVML streams to record: 'all' (default) or a comma list of samples (the driver's 50 Hz "
    "buffer), power (instant and 1 s average, polled every 90 ms, for calibrate), energy "
    "(the counter), state (clocks, utilisation, temperature, limit), processes (each "
    "process's utilisation and identity, docs/processes.md); 'samples,energy' costs the "
    "least CPU")


NVML_INTERVALS_HELP = (
    "the NVML reader's cadences in seconds where they differ from the defaults "
    + ", ".join(f"{k}={v:g}" for k, v in DEFAULT_INTERVALS_S.items())
    + f" (drain: the 50 Hz buffer, at most {MAX_DRAIN_S:g} s; emit: send to the recorder); "
    f"'{FRUGAL_INTERVALS}' costs the least CPU")


def default_output(prefix: str) -> str:
    return f"{prefix}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.h5"


def command_of(args: argparse.Namespace) -> list[str]:
    command = list(args.command or [])
    return command[1:] if command[:1] == ["--"] else command


def nvml_specs(choice: NvmlChoice, other_sources: bool = False) -> list[SourceSpec]:
    """Source-process specs for the chosen GPUs (resolved here, read in the children)."""
    with nvml_acquirers(choice, other_sources=other_sources) as gpus:
        indices = [int(name.removeprefix("gpu")) for name, _ in gpus]
    return [SourceSpec(f"gpu{i}", "nvml", gpu_index=i, simulate=choice.simulate,
                       simulated_gpus=choice.simulated_gpus, seed=choice.seed,
                       nvml_streams=choice.streams, nvml_intervals=choice.intervals,
                       shared_processes=choice.shared_processes,
                       process_cmdlines=choice.process_cmdlines)
            for i in indices]


def meter_specs(texts: list[str], bench: BenchConfig | None = None,
                amd: Sequence[tuple[str, str]] = (), amd_opts: str = "") -> list[SourceSpec]:
    """Source-process specs for the bench's meters, every ``--meter`` and ``--amd`` GPU."""
    specs = [SourceSpec(d.id, "meter", meter=f"{d.id}={d.kind}:{d.address}",
                        meter_options=meter_options_json(d)) for d in bench_meters(bench)]
    parsed = [parse_meter_spec(t) for t in texts]
    return specs + [SourceSpec(p.source_id, "meter", meter=t)
                    for p, t in zip(parsed, texts, strict=True)] + [
        SourceSpec(sid, "meter", meter=f"{sid}=amd:{address}", meter_options=amd_opts)
        for sid, address in amd]


def bench_meters(bench: BenchConfig | None) -> list[DeviceConfig]:
    return [] if bench is None else bench.meters


BENCH_CONFLICTS = {"nvml": "--nvml", "simulate": "--simulate",
                   "simulated_gpus": "--simulated-gpus", "seed": "--seed",
                   "nvml_streams": "--nvml-streams", "nvml_intervals": "--nvml-intervals",
                   "shared_processes": "--shared-processes"}


def load_bench_for(args: argparse.Namespace) -> BenchConfig | None:
    """The ``--bench`` file, refusing flags that would say differently which GPUs to read.

    ``--meter`` adds meters to the bench's (stream ids must stay unique); ``--nvml``,
    ``--simulate``, ``--simulated-gpus``, ``--seed``, ``--nvml-streams`` and
    ``--nvml-intervals`` are the bench's nvml entry's job.
    """
    if args.bench is None:
        ids = [parse_meter_spec(t).source_id for t in args.meter]
        check_unique_ids(ids)
        return None
    given = [flag for key, flag in BENCH_CONFLICTS.items() if getattr(args, key) not in
             (None, False)]
    if given:
        raise UsageError(f"--bench {args.bench} with {', '.join(given)}: the bench file's "
                         "nvml device says which GPUs to read and how (gpus, simulate, "
                         "simulated_gpus, seed, streams, intervals); set them there or drop "
                         "--bench")
    bench = load_bench(args.bench)
    check_unique_ids([d.id for d in bench.meters]
                     + [parse_meter_spec(t).source_id for t in args.meter],
                     f"--bench {args.bench} and --meter")
    return bench


def nvml_choice(args: argparse.Namespace, bench: BenchConfig | None) -> NvmlChoice:
    """Which GPUs to read and how, from the bench file or the flags."""
    if bench is not None:
        return replace(nvml_selection(bench), process_cmdlines=args.process_cmdlines)
    check_simulated_gpus(args.simulated_gpus)
    if args.shared_processes and not args.simulate:
        raise UsageError("--shared-processes needs --simulate: it shares the simulated GPU")
    gpus = args.nvml or ("none" if args.amd else "all")  # an AMD host has no NVIDIA GPU
    return NvmlChoice(gpus, args.simulate, 1 if args.simulated_gpus is None
                      else args.simulated_gpus, args.seed or 0, args.nvml_streams or "all",
                      args.nvml_intervals or "", args.shared_processes or 0,
                      args.process_cmdlines)


def check_simulated_gpus(count: int | None) -> None:
    """Refuse up front what would grow for a minute before failing (issue 36, item 8)."""
    if count is not None and not 1 <= count <= MAX_SIMULATED_GPUS:
        raise UsageError(f"--simulated-gpus must be 1 to {MAX_SIMULATED_GPUS}, got {count}")


def summary_table(run: Run) -> tuple[str, list[SourceSummary]]:
    """The per-stream table and its rows; a stream it cannot integrate is said, not a crash.

    The rows are on disk whatever the table can show: the recorder flagged the ones that
    cannot be right (``time_invalid``, ``not_finite``: docs/run-file.md).
    """
    try:
        rows = summarise(run)
        return format_table(rows), rows
    except UsageError as e:
        status = json.loads(run.attrs.get(RECORDER_STATUS_JSON) or "{}")
        flagged = {sid: counts for sid, source in status.get("sources", {}).items()
                   if (counts := source.get("flagged"))}
        print(f"wattlab: no summary table for {run.path}: {e}; rows flagged at ingest: "
              f"{flagged or 'none'} (time_invalid, not_finite: docs/run-file.md)",
              file=sys.stderr)
        return "", []


def unread_processes(run: Run) -> list[str]:
    """One line per GPU whose per-process readings were refused (``missing["processes"]``).

    On a MIG GPU the refusal is the driver's rule: the line names the per-instance stream
    that stands in for it, or why there is none either.
    """
    why = {sid.rpartition(".")[0]: view.descriptor.get("config", {}).get("missing", {})
           for sid, view in sorted(run.sources.items())}
    lines = []
    for gpu, missing in why.items():
        if not missing.get("processes"):
            continue
        instead = (f"; MIG is on: each instance's activity is in {gpu}.mig"
                   if f"{gpu}.mig" in run.sources else
                   f"; no per-instance stream either: {missing['mig']}" if "mig" in missing
                   else "")
        lines.append(f"wattlab: {gpu}: no per-process stream ({missing['processes']}){instead}")
    return lines


def report(result: SessionResult) -> int:
    """Print the per-source summary of a finished session; 1 if a bench meter is miswired.

    A file the session could not repair after losing its recorder gets the one line that
    says so (with the `wattlab repair` command), not a summary read from a file left open.
    A bench meter whose board power disagrees with its GPU's reading beyond the instruments'
    accuracies gets the last line (docs/meters.md): every row is kept, the figures are not.
    """
    full = result.disk_full
    if full is not None and not full.in_gaps:
        lost_spans(full)
    salvaged = result.salvage
    if salvaged is not None and salvaged.error is not None:
        print(salvaged.line(), file=sys.stderr)
        return 0
    with Run(result.output) as run:
        table, rows = summary_table(run)
        print(table)
        wiring = wiring_mismatches(run.sources, {r.source_id: r.mean_power_w for r in rows})
        gaps = run.gaps
        markers = run.markers
        unread = unread_processes(run)
    print(f"run file: {result.output} ({len(markers)} markers, {len(gaps)} gaps)")
    for line in unread:
        print(line, file=sys.stderr)
    for gap in gaps:
        print(f"  gap in {gap.source}: {gap.reason}{span_text(gap)}")
    for name, error in result.source_errors.items():
        print(f"wattlab: source {name} failed: {error}", file=sys.stderr)
    log_trackers(result.output)
    if result.recorder_restarts:
        print(f"wattlab: the recorder was restarted {result.recorder_restarts} time(s); "
              "see /gaps for anything lost", file=sys.stderr)
    for name, count in result.source_restarts.items():
        print(f"wattlab: source {name} was restarted {count} time(s)", file=sys.stderr)
    rejected = result.recorder_status.get("rejected", 0)
    if rejected:
        print(f"wattlab: the recorder rejected {rejected} malformed message(s): "
              f"{result.recorder_status.get('last_rejection')}", file=sys.stderr)
    if salvaged is not None:
        print(salvaged.line(), file=sys.stderr)
    for mismatch in wiring:
        print(f"wattlab: error: {mismatch.line()}", file=sys.stderr)
    return 1 if wiring else 0


def log_trackers(output: str) -> None:
    """The run's energy into the trackers its workload announced (docs/trackers.md).

    A tracker that fails costs a warning, never the recording's exit status.
    """
    from wattlab.integrations.trackers import log_announced

    try:
        lines = log_announced(output)
    except Exception as e:  # the recording is safe on disk whatever happens here
        print(f"wattlab: logging energy to the workload's tracker failed: {e}", file=sys.stderr)
        return
    for line in lines:
        print(f"wattlab: {line}")


def span_text(gap: GapRow) -> str:
    """`` (from 3.1 s to 3.8 s)`` where both ends of a gap are known.

    Tenths of a second, or milliseconds where the gap is shorter than the tenths show (a
    lost update read "from 9.5 s to 9.5 s").
    """
    if gap.time_first_ns is None or gap.time_last_ns is None:
        return ""
    first_s, last_s = gap.time_first_ns / 1e9, gap.time_last_ns / 1e9
    digits = 1 if f"{first_s:.1f}" != f"{last_s:.1f}" else 3
    return f" (from {first_s:.{digits}f} s to {last_s:.{digits}f} s)"


def lost_spans(full: DiskFullReport) -> None:
    """The spans a full disk cost, when the file had no room for their /gaps rows."""
    for span in full.spans:
        since = "the start" if span.last_row_s is None else f"{span.last_row_s:.1f} s"
        print(f"  lost in {span.source}: from {since} to the stop at {full.failed_at_s:.1f} s "
              f"(disk full, {full.error}; not in /gaps: no room)")


def exit_status(result: SessionResult) -> int:
    """The exit status of a finished session.

    1 if the disk filled or the recorder was lost (died unrestarted, or killed when it did
    not stop); else the command's own status; 130 after Ctrl-C; 1 if a source failed or
    rows were lost on the way (``rows_lost``).
    """
    if result.disk_full is not None or result.salvage is not None:
        return 1
    code = result.command_exit_code
    if code is not None and code != 0:
        return code if code > 0 else 128 - code  # killed by signal -code, as shells report
    if result.interrupted:
        return 130
    return 1 if result.source_errors or rows_lost(result) else 0


def rows_lost(result: SessionResult) -> bool:
    """Rows lost though the recorder closed the file: never an exit status 0.

    A stream the recorder holds fewer rows of than its source sent (batches dropped at
    the source while the recorder was away or slow: in /gaps, but lost), a source process
    that died and was restarted (what it held died with it), or any other gap row: a
    meter's updates not read in time, frames a device lost, rows the recorder refused.
    """
    streams = result.recorder_status.get("sources", {})
    return (any(sent > streams.get(sid, {}).get("rows", 0) for sid, sent in
                result.rows_sent.items()) or any(result.source_restarts.values())
            or gap_rows(result.output) > 0)


def gap_rows(path: str) -> int:
    """Rows of the closed run file's /gaps (0 where there is no file to read)."""
    try:
        with Run(path) as run:
            return len(run.gaps)
    except WattlabError:
        return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "record", help="record meters and NVML while a command runs",
        description="Record every source into a new run file. Put the command to measure "
                    "after '--'; without one, give --duration.")
    p.add_argument("-o", "--output", help="run file to create (default: run-<time>.h5)")
    p.add_argument("--bench", metavar="BENCH.toml", type=InputFile("bench file"),
                   help="a bench file listing the GPUs and meters to record (`wattlab bench "
                        "init` writes a template); --meter adds meters to it")
    p.add_argument("--nvml",
                   help="GPUs to read: 'all', a list like '0,1', or 'none' (default: all; "
                        "with --meter or --agent, 'all' on a machine without the NVIDIA "
                        "driver records no GPU and says so)")
    p.add_argument("--amd", metavar="all|0,1",
                   help="also read AMD GPUs through amdsmi (ROCm): 'all' or a list; streams "
                        "amd{i}.power, amd{i}.energy, amd{i}.state; --simulate reads a "
                        "simulated MI300X. With --amd, --nvml defaults to none "
                        "(docs/node-energy.md)")
    p.add_argument("--nvml-streams", metavar="LIST", help=NVML_STREAMS_HELP)
    p.add_argument("--nvml-intervals", metavar="KEY=S,...", help=NVML_INTERVALS_HELP)
    p.add_argument("--simulate", action="store_true",
                   help="use the simulated GPU instead of NVML (no hardware needed)")
    p.add_argument("--simulated-gpus", type=int, metavar="N",
                   help="how many simulated GPUs with --simulate (default 1)")
    p.add_argument("--seed", type=SEED, help="seed of the simulated GPU's workload (default 0)")
    p.add_argument("--shared-processes", metavar="N",
                   type=Number(1, MAX_SHARED_PROCESSES, integer=True),
                   help="with --simulate: N simulated processes share each GPU (after 3 s "
                        "idle, each alone in turn, then together, over 30 s), recorded in "
                        "gpu{i}.processes with their true energy (docs/processes.md)")
    p.add_argument("--process-cmdlines", action="store_true",
                   help="put each GPU process's command line in its identity marker, other "
                        "users' too (default: none)")
    p.add_argument("--duration", type=RECORD_S, metavar="S", help="stop after S seconds")
    p.add_argument("--meter", action="append", default=[], metavar="[ID=]KIND:ADDRESS",
                   help="an external meter, e.g. powersensor3:/dev/ttyACM0 or "
                        "wall=wt300e:USB0::0x0B21::0x0025::...::INSTR (repeatable)")
    p.add_argument("--rapl", nargs="?", const="/sys/class/powercap", metavar="PATH",
                   type=Folder("powercap folder", must_exist=True),
                   help="also record CPU package and DRAM energy from Linux powercap (RAPL) "
                        "at PATH (default /sys/class/powercap; an emulated tree for tests); "
                        "the same as --meter rapl:PATH")
    p.add_argument("--per-node", action="store_true",
                   help="under torchrun, torch.distributed or MPI: only one process per node "
                        "(local rank 0, holding a node-local lock) records; the other ranks "
                        "run the command unrecorded. '{node}' in -o becomes the node rank "
                        "(docs/node-energy.md)")
    faults = p.add_argument_group("fault tolerance (see docs/reliability.md)")
    faults.add_argument("--source-processes", action="store_true",
                        help="run each GPU reader and meter in its own process")
    faults.add_argument("--restart-sources", action="store_true",
                        help="restart a source process that dies (implies --source-processes)")
    faults.add_argument("--max-restarts", type=Number(0, 1000, integer=True), default=3,
                        metavar="N",
                        help="restarts allowed per source and for the recorder (default 3)")
    faults.add_argument("--no-restart-recorder", action="store_true",
                        help="end the session if the recorder dies instead of restarting it")
    faults.add_argument("--replay-buffer-mb", type=BUFFER_MB, default=64.0, metavar="MB",
                        help="per source: data kept until on disk, resent to a restarted "
                             "recorder (default 64)")
    faults.add_argument("--backlog-mb", type=BUFFER_MB, default=32.0, metavar="MB",
                        help="per source: unsent data kept while the recorder is slow or "
                             "away; beyond it batches are dropped and recorded as gaps "
                             "(default 32)")
    faults.add_argument("--stop-timeout", type=float, default=STOP_TIMEOUT_S, metavar="S",
                        help="at the end, how long the recorder may take to close the file "
                             "and to exit; one that does not (a stalled disk) is killed and "
                             "the session repairs the file and exits 1 (default "
                             f"{STOP_TIMEOUT_S:g}, at most {MAX_STOP_TIMEOUT_S:g})")
    remote = p.add_argument_group("remote agents (see `wattlab agent`, `wattlab keys`)")
    remote.add_argument("--listen", nargs="?", const=DEFAULT_LISTEN, metavar="tcp://ADDR:PORT",
                        help=f"accept agents here, CurveZMQ only (default {DEFAULT_LISTEN}: "
                             "loopback; give tcp://0.0.0.0:PORT to accept other hosts)")
    remote.add_argument("--server-key", metavar="NAME.key_secret", type=InputFile("key file"),
                        help="this recorder's secret key file")
    remote.add_argument("--allow-keys", metavar="DIR", type=Folder("keys folder", must_exist=True),
                        help="folder of the agents' public NAME.key files (only those connect)")
    remote.add_argument("--agent", action="append", default=[], metavar="NAME",
                        help="wait for this agent before the workload starts (repeatable)")
    p.add_argument("--auto-markers", nargs="?", const="steps", default=False,
                   choices=("steps", "layers"),
                   help="a Python workload gets phase markers from Keras, Lightning, the "
                        "Hugging Face Trainer or torch without a code change; =layers adds "
                        "a phase per leaf module on every WATTLAB_LAYER_EVERY-th step")
    add_min_free_option(p)
    add_prometheus_option(p)
    add_scrape_options(p)
    p.add_argument("--live", action=argparse.BooleanOptionalAction, default=None,
                   help="draw the live panel (default: only when stdout is a terminal)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def add_min_free_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-free-mb", type=Number(0, 1e9, unit="MB"), metavar="MB",
                   help="warn when the output's disk has less free space than this "
                        "(default: the --duration's data, or five minutes of it); under a "
                        "minute of data the run is refused")


def add_prometheus_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", metavar="[HOST:]PORT",
                   help="serve every stream's power, energy, sample and gap counts in "
                        "Prometheus's text format at http://HOST:PORT/metrics (loopback "
                        "unless a HOST is given; needs the prometheus extra; see docs/fleet.md)")


def prometheus_options(args: argparse.Namespace) -> dict[str, Any]:
    """RecorderConfig's ``prometheus`` field, checked (the package, a free port) up front."""
    if not args.prometheus:
        return {}
    from wattlab.sync.recorder import check_free, require_client

    require_client()
    check_free(args.prometheus)
    return {"prometheus": args.prometheus}


def planned_streams(gpus: int, nvml: NvmlChoice, meters: list[str],
                    bench: BenchConfig | None) -> list[str]:
    """What will be recorded, as the disk budget counts it (see disk_budget.stream_rates)."""
    kinds = [d.kind for d in bench_meters(bench)] + [parse_meter_spec(t).kind for t in meters]
    return nvml_streams(gpus, nvml.streams) + kinds


def remote_options(args: argparse.Namespace) -> dict[str, Any]:
    """RecorderConfig fields for --listen; keys are checked here so mistakes fail early."""
    if not args.listen:
        if args.agent or args.server_key or args.allow_keys:
            raise UsageError("--agent, --server-key and --allow-keys need --listen")
        return {}
    if not args.server_key or not args.allow_keys:
        raise UsageError("--listen needs --server-key and --allow-keys: the remote bus is "
                         "never open to unknown peers")
    from wattlab.sync.bus import load_allowed_keys, load_keypair

    load_keypair(args.server_key)
    names = set(load_allowed_keys(args.allow_keys).values())
    unknown = sorted(set(args.agent) - names)
    if unknown:
        raise UsageError(f"--agent {unknown}: no such key in {args.allow_keys}")
    return {"listen": args.listen, "server_key": args.server_key,
            "allowed_keys": args.allow_keys, "expected_hosts": list(args.agent)}


def fault_options(args: argparse.Namespace) -> dict[str, Any]:
    """Session fields for the fault-tolerance options (the other ranges: the parser's types)."""
    if not 0 < args.stop_timeout <= MAX_STOP_TIMEOUT_S:
        raise UsageError(f"--stop-timeout must be in (0, {MAX_STOP_TIMEOUT_S:g}] s, "
                         f"got {args.stop_timeout}")
    return {"restart_sources": args.restart_sources, "max_restarts": args.max_restarts,
            "stop_timeout_s": args.stop_timeout,
            "restart_recorder": not args.no_restart_recorder,
            "window_bytes": int(args.replay_buffer_mb * 2**20),
            "backlog_bytes": int(args.backlog_mb * 2**20)}


def run_per_node(args: argparse.Namespace) -> int:
    """``--per-node``: record if this process is the node's recorder, else just run the command."""
    import os

    from wattlab.integrations.ranks import node_rank, node_recorder

    command = command_of(args)
    if not command:
        raise UsageError("--per-node needs the command after '--' (the rank's workload)")
    with node_recorder() as election:
        print(f"wattlab: {election.why}", file=sys.stderr, flush=True)
        if election.records:
            args.per_node = False
            args.output = (args.output or default_output("run")).replace("{node}", node_rank())
            return run(args)
    os.execvp(command[0], command)  # this rank's workload, unrecorded; never returns


def run(args: argparse.Namespace) -> int:
    if args.per_node:
        return run_per_node(args)
    if args.rapl:
        args.meter = [*args.meter, f"rapl:{args.rapl}"]
    command = command_of(args)
    if not command and args.duration is None:
        raise UsageError("record needs a command after '--' or --duration S")
    if args.duration is not None and args.duration <= 0:
        raise UsageError(f"--duration must be > 0 s, got {args.duration}")
    bench = load_bench_for(args)
    scrapes = scrape_sources(args)
    output = args.output or default_output("run")
    options = remote_options(args) | prometheus_options(args)
    faults = fault_options(args)
    nvml = nvml_choice(args, bench)
    amd_opts = amd_options(args.simulate, args.simulated_gpus, args.seed, args.nvml_streams,
                           args.nvml_intervals)
    common: dict[str, Any] = {"command": command or None, "duration_s": args.duration,
                              "recorder_options": options,
                              "bench_config": None if bench is None else bench.to_json(),
                              "auto_markers": args.auto_markers, **faults}
    if args.source_processes or args.restart_sources:
        gpu_specs = nvml_specs(nvml, other_sources=bool(args.meter or args.agent or scrapes))
        if bench is not None:
            check_gpus_exist(bench, [(s.name, s) for s in gpu_specs])
        amd = amd_devices(args.amd, amd_opts) if args.amd else []
        specs = gpu_specs + meter_specs(args.meter, bench, amd, json.dumps(amd_opts)) + [
            SourceSpec(s.source_id, "meter", meter=s.meter_text, meter_options=s.options_json)
            for s in scrapes]
        if not specs and not args.agent:
            raise UsageError("nothing to record: no GPU selected (--nvml none), no meter "
                             "and no --agent")
        check_room(output, planned_streams(len(gpu_specs), nvml, args.meter, bench),
                   args.duration, args.min_free_mb)
        with live_panel(output, enabled=args.live):
            result = Session(output, [], source_specs=specs, **common).run()
        miswired = report(result)
        return exit_status(result) or miswired
    amd_readers = amd_acquirers(args.amd, amd_opts)
    others = bool(args.meter or args.agent or scrapes)
    with (nvml_acquirers(nvml, other_sources=others) if bench is None
          else bench_acquirers(bench)) as sources:
        acquirers = sources + meter_acquirers(args.meter) + amd_readers + [
            (s.source_id, s.acquirer()) for s in scrapes]
        if not acquirers and not args.agent:
            raise UsageError("nothing to record: no GPU selected (--nvml none), no meter "
                             "and no --agent")
        gpus = sum(isinstance(acquirer, NvmlAcquirer) for _, acquirer in sources)
        check_room(output, planned_streams(gpus, nvml, args.meter, bench), args.duration,
                   args.min_free_mb)
        with live_panel(output, enabled=args.live):
            result = Session(output, acquirers, **common).run()
    miswired = report(result)
    return exit_status(result) or miswired
