"""Work done as cumulative counters: counter streams and ``wattlab.count`` markers.

A counter stream holds what a server reported, raw: a drop is a *reset* (the server
restarted) and, as Prometheus's ``increase()`` does, the value after it counts from 0;
each reset is reported. A counter read now and then knows the work done between two reads,
not when inside them: the increase over [t0, t1] is interpolated between reads and its ±
is the increment of the read interval each edge falls in (a bound). Count markers are
exact: each count is at its own time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wattlab.analysis.attribution.core import FloatArray
from wattlab.errors import UsageError
from wattlab.runfile import MarkerRow, Run

UNIT_WORDS = {"token": "token", "request": "request", "sample": "sample"}
OUTPUT_WORDS = ("generation", "output", "completion")  # "tokens": the ones generated


@dataclass
class CounterSeries:
    """One counter: read times (s), cumulative value after resets, and the resets' times."""

    name: str
    unit: str
    origin: str
    t_s: FloatArray
    value: FloatArray
    exact: bool
    resets_s: list[float] = field(default_factory=list)
    failed_reads: int = 0  # the stream's gap rows (a failed scrape)
    metric: str = ""  # the Prometheus metric a labelled series belongs to
    series: int = 1  # series summed into this counter (a metric's sum over its labels)

    def increase(self, t0_s: float, t1_s: float) -> tuple[float, float, list[str]]:
        """(work done in [t0, t1], its ±, notes)."""
        if self.t_s.size == 0:
            return 0.0, 0.0, [f"{self.name}: no reads"]
        if self.exact:
            at = np.searchsorted(self.t_s, [t0_s, t1_s], side="right") - 1
            v = [0.0 if i < 0 else float(self.value[i]) for i in at]
            return v[1] - v[0], 0.0, []
        notes = []
        if t0_s < self.t_s[0] or t1_s > self.t_s[-1]:
            notes.append(f"{self.name}: read only from {self.t_s[0]:.3f} to {self.t_s[-1]:.3f} "
                         f"s; work outside that is not counted")
        v0, v1 = np.interp([t0_s, t1_s], self.t_s, self.value)
        return float(v1 - v0), self._edge(t0_s) + self._edge(t1_s), notes

    def _edge(self, t_s: float) -> float:
        """The increment of the read interval that holds ``t_s`` (0 at or outside the reads)."""
        i = int(np.searchsorted(self.t_s, t_s, side="right"))
        if i <= 0 or i >= self.t_s.size or self.t_s[i - 1] == t_s:
            return 0.0
        return float(self.value[i] - self.value[i - 1])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "origin": self.origin,
                "reads": int(self.t_s.size), "exact": self.exact, "resets_s": self.resets_s,
                "failed_reads": self.failed_reads}


def cumulative(raw: FloatArray) -> tuple[FloatArray, list[int]]:
    """Reset-handled cumulative values from raw reads, and the indices of the resets."""
    step = np.diff(raw)
    resets = np.flatnonzero(step < 0)
    step[resets] = raw[resets + 1]  # after a drop the counter counts from 0
    out: FloatArray = np.concatenate((raw[:1], raw[0] + np.cumsum(step)))
    return out, [int(i) + 1 for i in resets]


def stream_counters(run: Run) -> list[CounterSeries]:
    """Every channel of every counter source (contract: ``kind="counter"``)."""
    out = []
    gaps = run.gaps
    for view in run.sources.values():
        if view.kind != "counter" or len(view) == 0:
            continue
        t = view.time_s
        failed = sum(g.source == view.source_id for g in gaps)
        series = view.descriptor.get("config", {}).get("series", {})
        ours = []
        for name, unit in zip(view.channel_names, view.units, strict=True):
            raw = np.asarray(view.channel(name), dtype=np.float64)
            ok = np.isfinite(raw)
            value, resets = cumulative(raw[ok])
            ours.append(CounterSeries(name, unit, f"stream {view.source_id}", t[ok], value,
                                      False, [float(t[ok][i]) for i in resets], failed,
                                      str(series.get(name, {}).get("metric", ""))))
        out += ours + metric_sums(ours)
    return out


def metric_sums(series: Sequence[CounterSeries]) -> list[CounterSeries]:
    """A metric served as several labelled series, summed: what "requests" means.

    vLLM serves its finished requests as one series per ``finished_reason``. Rows where a
    series was not read (not a number) are left out of the sum.
    """
    by_metric: dict[str, list[CounterSeries]] = {}
    for c in series:
        if c.metric and c.metric != c.name:
            by_metric.setdefault(c.metric, []).append(c)
    out = []
    for metric, parts in by_metric.items():
        if len(parts) < 2 or metric in {c.name for c in series}:
            continue
        t = parts[0].t_s
        for c in parts[1:]:
            t = np.intersect1d(t, c.t_s)
        total = sum(np.interp(t, c.t_s, c.value) for c in parts)
        first = parts[0]
        out.append(CounterSeries(metric, first.unit, first.origin, t, np.asarray(total),
                                 False, sorted(r for c in parts for r in c.resets_s),
                                 first.failed_reads, metric, len(parts)))
    return out


def marker_counters(markers: Sequence[MarkerRow]) -> list[CounterSeries]:
    """Each name's ``wattlab.count`` markers summed in time order."""
    by_name: dict[str, list[MarkerRow]] = {}
    for m in markers:
        if m.kind == "count":
            by_name.setdefault(m.name, []).append(m)
    out = []
    for name, rows in by_name.items():
        rows.sort(key=lambda m: m.time_ns)
        n = np.array([float(m.payload.get("n", 1)) for m in rows])
        out.append(CounterSeries(name, "1", "count markers",
                                 np.array([m.time_ns / 1e9 for m in rows]), np.cumsum(n), True))
    return out


def run_counters(run: Run) -> list[CounterSeries]:
    """Counter streams, then count markers (a marker name a stream has is prefixed)."""
    streams = stream_counters(run)
    taken = {c.name for c in streams}
    marks = marker_counters(run.markers)
    for c in marks:
        if c.name in taken:
            c.name = f"count:{c.name}"
    return streams + marks


def find_counter(counters: Sequence[CounterSeries], unit: str, where: str) -> CounterSeries:
    """The counter ``unit`` names: its name, else its unit (tokens, requests, samples).

    Several counters of the unit: for tokens the generated ones (vLLM's
    ``generation_tokens``) win, else the choice is the user's. None: an error naming them.
    """
    exact = [c for c in counters if c.name == unit]
    if exact:
        return exact[0]
    word = unit.lower().removesuffix("s")
    of_unit = [c for c in counters if c.unit == UNIT_WORDS.get(word)
               or c.name.lower().removesuffix("s") == word]
    if len(of_unit) > 1 and word == "token":
        out = [c for c in of_unit if any(w in c.name.lower() for w in OUTPUT_WORDS)]
        of_unit = out or of_unit
    sums = [c for c in of_unit if c.series > 1]
    if len(sums) == 1 and all(c is sums[0] or c.metric == sums[0].name for c in of_unit):
        of_unit = sums  # one metric's labelled series and their sum: the sum
    if len(of_unit) == 1:
        return of_unit[0]
    names = ", ".join(f"{c.name} [{c.unit}]" for c in counters) or "none"
    if of_unit:
        raise UsageError(f"--per {unit}: {where} has several counters of that unit; name one: "
                         + ", ".join(c.name for c in of_unit))
    raise UsageError(f"--per {unit}: no counter in {where} matches; its counters: {names}")
