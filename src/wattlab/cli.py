"""The ``wattlab`` command: parse arguments, dispatch, and turn errors into exit statuses.

Exit statuses: 0 success; 2 usage errors (bad argument, existing output, unknown GPU);
1 a measurement that failed at run time; 141 when the reader of stdout went away;
``wattlab record -- CMD`` returns CMD's status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from wattlab.errors import UsageError, WattlabError
from wattlab.runtime_env import quiet_math_threads

EXIT_USAGE = 2
EXIT_FAILURE = 1


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so every usage error takes one path."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser(verb: str | None = None) -> _Parser:
    """Every module in ``wattlab.commands`` is a verb: it adds its own sub-parser.

    Given the module name of the verb being run, only that module is imported: start-up
    then costs that verb's dependencies, not every verb's (matplotlib, scipy, …).
    """
    import importlib
    import pkgutil

    from wattlab import commands
    from wattlab.version import __version__

    parser = _Parser(prog="wattlab", description="Measure how much energy GPU work really takes.")
    parser.add_argument("--version", action="version", version=f"wattlab {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    infos = sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name)
    if any(info.name == verb for info in infos):
        infos = [info for info in infos if info.name == verb]
    for info in infos:
        module = importlib.import_module(f"wattlab.commands.{info.name}")
        command = module.add_parser(sub)
        command.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    quiet_math_threads()
    try:
        args = build_parser(args_list[0] if args_list else None).parse_args(args_list)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except UsageError as e:
        print(f"wattlab: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except WattlabError as e:
        print(f"wattlab: error: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("wattlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_went_away()


def _reader_went_away() -> int:
    """``wattlab info RUN | head``: the reader closed the pipe; stop quietly, as cat does.

    Python flushes stdout again at exit and would print a second traceback: point stdout at
    /dev/null first. 141 is what a shell reports for a process killed by SIGPIPE.
    """
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


if __name__ == "__main__":
    sys.exit(main())
