"""Prometheus's text exposition format, read for the few metrics a recording wants.

Why our own parser: the core install stays light (prometheus-client is an optional extra),
and a scrape at 10 Hz must cost next to nothing, so only the lines of the wanted metrics are
parsed: each wanted name is found by a plain substring search for it at a line's start, and
every other line (comments, histograms, other metrics: most of a real server's page) is never
split nor looked at. A wanted line's optional timestamp is ignored (the scrape's own host
time is the sample's).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

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


def parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    labels: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text.rstrip()):
        m = LABEL.match(text, pos)
        if m is None:
            raise MeterError(f"labels {{{text}}} are not name=\"value\" pairs")
        labels.append((m.group(1), unescape(m.group(2))))
        pos = m.end()
    return tuple(sorted(labels))


def parse_value(text: str) -> float:
    if text in SPECIAL:
        return SPECIAL[text]
    try:
        return float(text)
    except ValueError:
        raise MeterError(f"sample value {text!r} is not a number") from None


def parse_exposition(text: str, metrics: tuple[str, ...], source: str = "exposition"
                     ) -> dict[Series, float]:
    """Every sample of ``metrics`` in ``text``, by series; ``source`` names it in errors.

    A wanted line that does not parse, or whose value is not a number, is a MeterError
    naming the line; the other lines are not looked at (an exposition this module cannot
    read elsewhere does not stop the wanted metrics from being read).
    """
    found: dict[Series, float] = {}
    for metric in metrics:
        for begin, line in lines_of(text, metric):
            try:
                key, rest = split_sample(line, metric)
                fields = rest.split(maxsplit=1)
                if not fields:
                    raise MeterError(f"cannot read {line[:120]!r}: no value")
                found[series_of(key)] = parse_value(fields[0])
            except MeterError as e:
                raise MeterError(f"{source} line {text.count(chr(10), 0, begin) + 1}: {e}"
                                 ) from None
    return found


def split_sample(line: str, metric: str) -> tuple[str, str]:
    """(``name{labels}``, ``value [timestamp]``) of a sample line.

    The last '}' closes the labels: neither a value nor a timestamp holds one.
    """
    if line[len(metric):len(metric) + 1] != "{":
        return metric, line[len(metric):]
    close = line.rfind("}")
    if close < 0:
        raise MeterError(f"cannot read {line[:120]!r}")
    return line[:close + 1], line[close + 1:]


@lru_cache(maxsize=4096)
def series_of(key: str) -> Series:
    """The series a sample's ``name{labels}`` names, parsed once and then remembered.

    Why remembered: a server writes the same series the same way every scrape, and parsing
    the labels is most of the cost of reading a line.
    """
    m = LINE.match(f"{key} 0")
    if m is None:
        raise MeterError(f"cannot read {key[:120]!r}")
    labels = m.group(2)
    return Series(m.group(1), parse_labels(labels) if labels else ())


def lines_of(text: str, metric: str) -> list[tuple[int, str]]:
    """(offset, line) of every line of ``text`` that is a sample of ``metric``."""
    out = []
    needle = "\n" + metric

    def after(pos: int) -> int:  # the next wanted line's offset, -1 when there is none
        found = text.find(needle, pos)
        return found + 1 if found >= 0 else -1

    begin = 0 if text.startswith(metric) else after(0)
    while begin >= 0:
        end = text.find("\n", begin)
        end = len(text) if end < 0 else end
        line = text[begin:end].rstrip("\r")
        if line[len(metric):len(metric) + 1] in ("{", " ", "\t", ""):  # not a longer name
            out.append((begin, line))
        begin = after(end)
    return out


def metric_names(text: str) -> list[str]:
    """Every metric name with a sample in ``text``, once each, in order: for error messages."""
    names: dict[str, None] = {}
    for line in text.split("\n"):
        if line and not line.startswith("#"):
            m = re.match(NAME, line)
            if m:
                names[m.group(0)] = None
    return list(names)
