"""`wattlab demo`: a whole bench with no hardware — simulated GPU under a varying load."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from wattlab.acquisition.acquirers import Acquirer
from wattlab.acquisition.markers.simulated_phases import SchedulePhaseMarkers
from wattlab.acquisition.meters import check_room, nvml_streams
from wattlab.acquisition.session import Session
from wattlab.arg_types import MAX_DEMO_S, SEED, OutputFile, seconds
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
                   help="length of the simulated workload (default 20 s)")
    p.add_argument("--seed", type=SEED, default=11, help="seed of the simulated workload")
    add_min_free_option(p)
    return p


def run(args: argparse.Namespace) -> int:
    from wattlab.acquisition.acquirers import NvmlAcquirer, PowerSensor3Acquirer, Wt300eAcquirer
    from wattlab.drivers.nvml import NvmlDriver
    from wattlab.hardware.virtual_bench import VirtualBench

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
