"""`wattlab power-model TRAIN.csv`: power vs clocks and utilisations, cross-validated."""

from __future__ import annotations

import argparse
import json
from typing import Any

from wattlab.analysis.models import MODELS, format_power_report, power_model_report
from wattlab.arg_types import InputFile


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "power-model", help="fit board power vs core/memory clock and unit utilisations",
        description="TRAIN is a gpmTOOL training CSV (Guerreiro et al.: power, core MHz, "
                    "memory MHz, utilisations per row). Each micro-benchmark is held out "
                    "in turn to measure the error on unseen kernels.")
    p.add_argument("training", type=InputFile("training file"),
                   help="gpmTOOL training file (micro_*.csv)")
    p.add_argument("--published", metavar="MODEL", type=InputFile("model file"),
                   help="gpmTOOL model file to score on the same rows (model_*.csv)")
    p.add_argument("--apps", metavar="APPS", type=InputFile("applications file"),
                   help="gpmTOOL applications file (real_*.csv): compare our predictions "
                        "with the published model's at every clock pair (needs --published)")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"models to cross-validate (default: {','.join(MODELS)})")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from wattlab.errors import UsageError

    if args.apps is not None and args.published is None:
        raise UsageError("--apps needs --published (the model to compare with)")
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    report = power_model_report(args.training, args.published, args.apps, models)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(format_power_report(report))
    return 0
