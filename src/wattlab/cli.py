"""The ``wattlab`` command: parse arguments, dispatch, and turn errors into exit statuses.

Exit statuses: 0 success; 2 usage errors (bad argument, existing output, unknown GPU);
1 a measurement that failed at run time; ``wattlab record -- CMD`` returns CMD's status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from wattlab.errors import UsageError, WattlabError

EXIT_USAGE = 2
EXIT_FAILURE = 1


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so every usage error takes one path."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _add_record(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser("record", help="record meters and NVML while a command runs",
                       description="Record every source into a new run file. Put the command "
                                   "to measure after '--'; without one, give --duration.")
    p.add_argument("-o", "--output", help="run file to create (default: run-<time>.h5)")
    p.add_argument("--nvml", default="all",
                   help="GPUs to read: 'all', a list like '0,1', or 'none' (default: all)")
    p.add_argument("--simulate", action="store_true",
                   help="use the simulated GPU instead of NVML (no hardware needed)")
    p.add_argument("--simulated-gpus", type=int, default=1, metavar="N",
                   help="how many simulated GPUs with --simulate (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated GPU's workload")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")


def _add_demo(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser("demo", help="record a simulated bench (no hardware) and summarise it")
    p.add_argument("-o", "--output", help="run file to create (default: demo-<time>.h5)")
    p.add_argument("--duration", type=float, default=20.0, metavar="S",
                   help="length of the simulated workload (default 20 s)")
    p.add_argument("--seed", type=int, default=11, help="seed of the simulated workload")


def _add_info(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser("info", help="describe a run file")
    p.add_argument("run", help="run file")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> _Parser:
    parser = _Parser(prog="wattlab", description="Measure how much energy GPU work really takes.")
    from wattlab import __version__

    parser.add_argument("--version", action="version", version=f"wattlab {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for add in (_add_record, _add_demo, _add_info):
        add(sub)
    return parser


def _handlers() -> dict[str, Callable[[argparse.Namespace], int]]:
    from wattlab.commands import demo, info, record

    return {"record": record.run, "demo": demo.run, "info": info.run}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(args_list)
        return _handlers()[args.verb](args)
    except UsageError as e:
        print(f"wattlab: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except WattlabError as e:
        print(f"wattlab: error: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("wattlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
