"""argparse types shared by every verb: finite, range-checked numbers and existing input files.

Why one module: a number option that reaches the code as NaN, inf or 1e308 used to end in a
traceback deep inside (``int(1e308 * 1e9)``, ``numpy.random.default_rng(-1)``) or to be
silently ignored (``nan < x`` is false). Every numeric option takes one of these types, so
argparse refuses the value at parse time with one line naming the option and its range, and
``tests/test_cli_bad_input.py`` finds every option by its type and tries nan, inf, -1 and
1e308 on it.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass

MAX_SEED = 2**32 - 1  # numpy's legacy RandomState bound; every simulated workload takes it
MAX_GPU_INDEX = 1023
MAX_RECORD_S = 366 * 86400.0  # a year: longer recordings are a typo, and ns times stay exact
MAX_TIMEOUT_S = 86400.0
MAX_SLOWDOWN = 10.0  # 1000 % slower: beyond it no setting is worth having
MAX_COUNT = 1_000_000  # rows to print, draws, iterations: more is a typo, not a request
MAX_JOBS = 4096
# simulated GPUs one recording takes, as many as a real host has: 16 recorded 3 s in 16 s
# on a 2-core machine, 64 missed the start handshake's 15 s (BENCHMARKS.md-style figures in
# docs/reliability.md); 100,000 grew to 7.9 GB before failing (issue 36)
MAX_SIMULATED_GPUS = 16
MAX_DEMO_S = 3600.0  # the demo runs in real time: an hour shows everything it shows
MAX_GRID_RATE_HZ = 1e5  # the reference grid of a calibration: 5x PowerSensor3's 20 kHz
MAX_BUFFER_MB = 65536.0


def non_empty_name(text: str) -> str:
    """A name (a unit, a counter): empty or blank is refused, not taken as "not given"."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a name, got an empty one")
    return text


@dataclass(frozen=True)
class Number:
    """A finite number within ``low``..``high`` (``low`` itself excluded when ``above``).

    ``unit`` follows the bounds in the message (``s``, ``Hz``, ``MB``).
    """

    low: float
    high: float
    integer: bool = False
    above: bool = False
    unit: str = ""

    @property
    def __name__(self) -> str:  # argparse names the type in some of its messages
        return "integer" if self.integer else "number"

    def rule(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        kind = "a whole number" if self.integer else "a number"
        low = f"> {self.low:.10g}" if self.above else f">= {self.low:.10g}"
        return f"must be {kind} {low} and <= {self.high:.10g}{unit} (the stated maximum)"

    def __call__(self, text: str) -> float:
        try:
            value: float = int(text) if self.integer else float(text)
        except ValueError:
            value = math.nan
        too_low = value <= self.low if self.above else value < self.low
        if not math.isfinite(value) or too_low or value > self.high:
            raise argparse.ArgumentTypeError(f"{self.rule()}, got {text!r}")
        return value


def seconds(high: float = MAX_TIMEOUT_S, *, zero: bool = False) -> Number:
    """A duration in seconds: > 0 (or >= 0 with ``zero``) and at most ``high``."""
    return Number(0.0, high, above=not zero, unit="s")


def finite(high: float = MAX_SLOWDOWN) -> Number:
    """Any finite number within ±``high``, where the caller's own check states the rule."""
    return Number(-high, high)


def count(low: int = 1, high: int = MAX_COUNT) -> Number:
    """A whole number of things (GPUs, rows, draws) in ``low``..``high``."""
    return Number(low, high, integer=True)


SEED = Number(0, MAX_SEED, integer=True)
GPU_INDEX = Number(0, MAX_GPU_INDEX, integer=True)
JOBS = count(1, MAX_JOBS)
SLOWDOWN = Number(0.0, MAX_SLOWDOWN)
RECORD_S = seconds(MAX_RECORD_S)
SESSION_TIME_S = Number(-MAX_RECORD_S, MAX_RECORD_S, unit="s")  # rows before the start exist
SIMULATED_GPUS = count(1, MAX_SIMULATED_GPUS)
GRID_RATE = Number(0.0, MAX_GRID_RATE_HZ, above=True, unit="Hz")
RATE_HZ = Number(0.0, 1e6, above=True, unit="Hz")
MILLISECONDS = Number(0.0, 1000.0, above=True, unit="ms")
BUFFER_MB = Number(0.0, MAX_BUFFER_MB, above=True, unit="MB")


@dataclass(frozen=True)
class InputFile:
    """An existing regular file: a missing path and a folder are refused by name.

    The content is the reader's to check (a text file given as a run file, an empty file):
    this only gives "no such file" and "is a folder" one wording everywhere.
    """

    what: str = "file"

    @property
    def __name__(self) -> str:
        return self.what

    def __call__(self, text: str) -> str:
        if os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text}: is a folder, not a {self.what}")
        if not os.path.exists(text):
            raise argparse.ArgumentTypeError(f"{text}: no such file (the {self.what})")
        if not os.path.isfile(text):
            raise argparse.ArgumentTypeError(f"{text}: not a regular file (a {self.what})")
        return text


@dataclass(frozen=True)
class OutputFile:
    """A file to create: a folder is refused, and so is an existing file unless ``overwrite``.

    Checked at parse time so a run that would end by refusing its output never starts; the
    writers still open with "x" (another process may create the file meanwhile).
    """

    what: str = "file"
    overwrite: bool = False

    @property
    def __name__(self) -> str:
        return self.what

    def __call__(self, text: str) -> str:
        if os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text}: is a folder; give a {self.what} to write")
        if os.path.lexists(text) and not self.overwrite:
            raise argparse.ArgumentTypeError(f"{text}: already exists; wattlab never "
                                             f"overwrites a {self.what} (choose another name)")
        return text


@dataclass(frozen=True)
class Folder:
    """A folder, created if missing (``must_exist``: to read from): a file there is refused."""

    what: str = "folder"
    must_exist: bool = False

    @property
    def __name__(self) -> str:
        return self.what

    def __call__(self, text: str) -> str:
        if os.path.lexists(text) and not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text}: is a file, not a {self.what}")
        if self.must_exist and not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text}: no such {self.what}")
        return text
