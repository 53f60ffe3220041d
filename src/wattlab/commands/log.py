"""`wattlab log RUN [--to mlflow|wandb|tensorboard]`: a run's energy into an experiment tracker.

Without ``--to`` the energy goes to every tracker the recorded workload announced (the
``tracker`` markers, see ``wattlab.integrations.trackers``); with it, to the one named.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from wattlab.arg_types import Folder, InputFile
from wattlab.errors import UsageError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "log", help="log a run's per-phase energy to MLflow, Weights & Biases or TensorBoard",
        description="Log energy/total_j, energy/<part>_j and energy/<phase>_j (step: the "
                    "phase's index) to a tracker (docs/trackers.md).")
    p.add_argument("run", type=InputFile("run file"), help="run file")
    p.add_argument("--to", choices=("mlflow", "wandb", "tensorboard"),
                   help="the tracker (default: those the workload announced)")
    p.add_argument("--run-id", help="mlflow or wandb: the run to add the energy to")
    p.add_argument("--tracking-uri", help="mlflow: the tracking URI (default: MLflow's own)")
    p.add_argument("--project", help="wandb: the project of --run-id")
    p.add_argument("--dir", type=Folder("log folder"),
                   help="tensorboard: the log folder; wandb: its local folder")
    p.add_argument("--dry-run", action="store_true",
                   help="print the metrics as JSON instead of logging them")
    return p


def run(args: argparse.Namespace) -> int:
    import wattlab
    from wattlab.integrations.trackers import energy_metrics, log_announced, log_to

    if args.dry_run or args.to:
        with wattlab.open(args.run) as run_file:
            metrics = energy_metrics(run_file)
        if args.dry_run:
            print(json.dumps([vars(m) for m in metrics], indent=1))
            return 0
        where = log_to(args.to, metrics, run_id=args.run_id, tracking_uri=args.tracking_uri,
                       project=args.project, directory=args.dir)
        print(f"{len(metrics)} energy metrics logged to {args.to} ({where})")
        return 0
    lines = log_announced(args.run)
    if not lines:
        raise UsageError(f"{args.run}: its workload announced no tracker; name one with "
                         "--to mlflow|wandb|tensorboard")
    print("\n".join(lines))
    return 0
