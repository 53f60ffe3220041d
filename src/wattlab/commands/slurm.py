"""`srun --ntasks-per-node=1 wattlab slurm -o job.h5 -- CMD`: a whole job in one run file."""

from __future__ import annotations

import argparse
import os
import shutil
from typing import Any

from wattlab.acquisition.acquirers import Acquirer
from wattlab.acquisition.meters import NvmlChoice, meter_acquirers
from wattlab.acquisition.session import (
    HostAcquirer,
    Session,
    SlurmTask,
    await_endpoint,
    free_port,
    job_summary,
    prepare,
    publish,
    rendezvous_dir,
    run_agent,
)
from wattlab.arg_types import RECORD_S
from wattlab.commands.record import (
    NVML_STREAMS_HELP,
    command_of,
    exit_status,
    nvml_acquirers,
    report,
)
from wattlab.errors import UsageError
from wattlab.sync.bus import ClientSecurity, load_keypair, load_public_key


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "slurm", help="record a Slurm job's GPUs and meters on every node into one run file",
        description="Start with srun, one task per node, inside an allocation. Task 0 "
                    "records its node and runs CMD (or --duration); every other task sends "
                    "its node's GPUs and meters to it as an agent. At the end the job's "
                    "energy per node and in total goes to slurm-JOBID.wattlab.json in the "
                    "submit folder and into the job's comment. See docs/fleet.md.")
    p.add_argument("-o", "--output", required=True,
                   help="run file to create, in a folder every node shares")
    p.add_argument("--duration", type=RECORD_S, metavar="S", help="stop after S seconds")
    p.add_argument("--nvml", default="all", help="GPUs to read on each node (default all)")
    p.add_argument("--nvml-streams", default="all", metavar="LIST", help=NVML_STREAMS_HELP)
    p.add_argument("--simulate", action="store_true",
                   help="simulated GPUs (seeded by the task number) instead of NVML")
    p.add_argument("--meter", action="append", default=[], metavar="[ID=]KIND:ADDRESS",
                   help="a meter on every node (repeatable)")
    p.add_argument("--listen-address", default="0.0.0.0", metavar="ADDR",
                   help="where task 0's recorder listens for the other nodes (default "
                        "0.0.0.0; CurveZMQ with keys made for this job only)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS... (task 0 runs it)")
    return p


def run(args: argparse.Namespace) -> int:
    task = SlurmTask.from_env(os.environ)
    command = command_of(args)
    if task.proc_id == 0 and not command and args.duration is None:
        raise UsageError("slurm needs a command after '--' or --duration S")
    folder = rendezvous_dir(args.output, task.job_id)
    choice = NvmlChoice(args.nvml, args.simulate, 1, task.proc_id, args.nvml_streams, "")
    with nvml_acquirers(choice, other_sources=bool(args.meter)) as gpus:
        acquirers = gpus + meter_acquirers(args.meter)
        if task.proc_id != 0:
            endpoint = await_endpoint(folder)
            security = ClientSecurity(load_keypair(folder / f"{task.name}.key_secret"),
                                      load_public_key(folder / "recorder.key"))
            agent = run_agent(endpoint, task.name, acquirers, security)
            return 0 if agent.finished_by_recorder and not agent.source_errors else 1
        port = free_port(args.listen_address)
        prepare(task, folder, args.listen_address, port)
        try:
            options = {"listen": f"tcp://{args.listen_address}:{port}",
                       "server_key": str(folder / "recorder.key_secret"),
                       "allowed_keys": str(folder / "allowed"), "expected_hosts": task.others}
            named: list[tuple[str, Acquirer]] = [
                (f"{task.name}.{n}", HostAcquirer(a, task.name)) for n, a in acquirers]
            result = Session(args.output, named, command=command or None,
                             duration_s=args.duration, recorder_options=options).run()
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the job's keys are for this run only
    report(result)
    summary = job_summary(args.output, task)
    print(f"job {task.job_id}: GPU energy {summary['total_gpu_energy_j']:.1f} J in total")
    for name, node in summary["nodes"].items():
        print(f"  {name} ({node['host']}): {node['gpu_energy_j']:.1f} J "
              f"({', '.join(node['gpu_streams']) or 'no GPU'})")
    own = summary["processes"]
    mine = own["this_job"]
    print(f"  this job's processes: {own['this_job_unknown']}" if mine is None else
          f"  this job's processes: {mine['energy_j']:.1f} ± {mine['pm_j']:.1f} J "
          f"(rule {own['rule']}; valid: {'yes' if mine['valid'] else 'NO'}; static and idle "
          "charged to no job)")
    for line in publish(summary, task):
        print(line)
    return exit_status(result)
