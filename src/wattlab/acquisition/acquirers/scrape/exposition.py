"""Prometheus's text exposition format, read for the few metrics a recording wants.

Why our own parser: the core install stays light (prometheus-client is an optional extra),
and a scrape at 10 Hz must cost next to nothing, so only the lines of the wanted metrics are
parsed: a line is picked by its name's prefix before anything else is done with it.
Comments (``# HELP``, ``# TYPE``), blank lines and other metrics are skipped unread; a
wanted line's optional timestamp is ignored (the scrape's own host time is the sample's).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from wattlab.errors import MeterError

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LINE = re.compile(rf"^({NAME})(?:\{{(.*)\}})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
SPECIAL = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


@dataclass(frozen=True)
class Series:
    """One time series: a metric name and its labels (sorted), as Prometheus names it."""

    metric: str
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        """``metric`` or ``metric{a="x",b="y"}``: the channel name in the run file."""
        if not self.labels:
            return self.metric
        inner = ",".join(f'{k}="{escape(v)}"' for k, v in self.labels)
        return f"{self.metric}{{{inner}}}"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def unescape(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: ESCAPES[m.group(0)], value)


def parse_labels(text: str, where: str) -> tuple[tuple[str, str], ...]:
    labels: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text.rstrip()):
        m = LABEL.match(text, pos)
        if m is None:
            raise MeterError(f"{where}: labels {{{text}}} are not name=\"value\" pairs")
        labels.append((m.group(1), unescape(m.group(2))))
        pos = m.end()
    return tuple(sorted(labels))


def parse_value(text: str, where: str) -> float:
    if text in SPECIAL:
        return SPECIAL[text]
    try:
        return float(text)
    except ValueError:
        raise MeterError(f"{where}: sample value {text!r} is not a number") from None


def parse_exposition(text: str, metrics: tuple[str, ...], source: str = "exposition"
                     ) -> dict[Series, float]:
    """Every sample of ``metrics`` in ``text``, by series; ``source`` names it in errors.

    A wanted line that does not parse, or whose value is not a number, is a MeterError
    naming the line; the other lines are not looked at (an exposition this module cannot
    read elsewhere does not stop the wanted metrics from being read).
    """
    found: dict[Series, float] = {}
    if not metrics:
        return found
    for number, line in enumerate(text.split("\n"), 1):
        if not line.startswith(metrics):
            continue
        m = LINE.match(line)
        if m is None:
            raise MeterError(f"{source} line {number}: cannot read {line[:120]!r}")
        name, labels, value = m.group(1), m.group(2), m.group(3)
        if name not in metrics:
            continue  # a longer name sharing the prefix (``x_total`` beside ``x``)
        where = f"{source} line {number}"
        found[Series(name, parse_labels(labels, where) if labels else ())] = parse_value(
            value, where)
    return found


def metric_names(text: str) -> list[str]:
    """Every metric name with a sample in ``text``, once each, in order: for error messages."""
    names: dict[str, None] = {}
    for line in text.split("\n"):
        if line and not line.startswith("#"):
            m = re.match(NAME, line)
            if m:
                names[m.group(0)] = None
    return list(names)
