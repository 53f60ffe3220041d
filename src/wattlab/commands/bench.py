"""`wattlab bench init|check`: write a bench file template; open every device it names."""

from __future__ import annotations

import argparse
import json
from typing import Any

from wattlab.acquisition.meters import check_bench, load_bench, write_template
from wattlab.arg_types import InputFile, OutputFile, seconds


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "bench", help="bench files: write a template, check every device",
        description="A bench file (TOML) lists the GPUs and meters of a bench for "
                    "`wattlab record --bench`.")
    verbs = p.add_subparsers(dest="bench_command", required=True)
    init = verbs.add_parser("init", help="write a commented bench file template")
    init.add_argument("-o", "--output", default="bench.toml", type=OutputFile("bench file"),
                      help="file to create (default bench.toml; never overwritten)")
    check = verbs.add_parser("check", help="validate a bench file and open every device")
    check.add_argument("bench", type=InputFile("bench file"), help="bench file")
    check.add_argument("--timeout", type=seconds(), default=3.0, metavar="S",
                       help="how long to wait for a first reading per device (default 3 s)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def run(args: argparse.Namespace) -> int:
    if args.bench_command == "init":
        write_template(args.output)
        print(f"wrote {args.output}: edit it, then `wattlab bench check {args.output}`")
        return 0
    config = load_bench(args.bench)
    results = check_bench(config, timeout_s=args.timeout)
    if args.json:
        print(json.dumps({"bench": config.to_json(), "devices": [r.to_json() for r in results]},
                         indent=2))
    else:
        print(f"{config.path}: bench {config.name or '-'}, {len(config.devices)} device "
              f"table(s)")
        for r in results:
            status = "ok" if r.ok else "FAILED"
            print(f"  [{status}] {r.name} ({r.kind}, line {r.line})")
            for stream in r.streams:
                ident = " ".join(x for x in (stream["model"], stream["serial"] and
                                             f"serial {stream['serial']}", stream["firmware"]
                                             and f"firmware {stream['firmware']}") if x)
                print(f"      {stream['source_id']}: {ident} - {', '.join(stream['channels'])}")
                if stream.get("rails"):
                    rails = ", ".join(f"{name} on {r['input']}"
                                      for name, r in stream["rails"].items())
                    fed = ("" if stream.get("feeds_gpu") is None else
                           f"; board_power_w (their sum) feeds GPU {stream['feeds_gpu']}")
                    print(f"      rails: {rails}{fed}")
            if r.first_values:
                values = ", ".join(f"{k} = {v:.4g}" for k, v in list(r.first_values.items())[:6])
                print(f"      first reading: {values}")
            if r.error:
                print(f"      error: {r.error}")
    return 0 if all(r.ok for r in results) else 1
