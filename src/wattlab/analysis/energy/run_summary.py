"""Per-source summary of a run: samples, rate, duration, mean power, energy, gaps.

Energy is integrated piecewise (trapezoids) in chunks, and never across a hole: where two
samples are further apart than ``GAP_FACTOR`` times the median spacing, the interval is
left out and reported as uncovered time instead of being bridged silently.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from wattlab.analysis.alignment import (
    GAP_FACTOR,
    PREFERRED_POWER_CHANNELS,
    integrate_view,
    power_channel,
    span_s,
)
from wattlab.runfile import Run, SourceView

__all__ = ["GAP_FACTOR", "PREFERRED_POWER_CHANNELS", "SourceSummary", "energy_channel",
           "format_table", "integrate_power", "power_channel", "summarise",
           "summarise_source"]


@dataclass
class SourceSummary:
    """What `wattlab record` prints per source and `wattlab info --json` returns."""

    source_id: str
    kind: str
    model: str
    samples: int
    duration_s: float
    rate_hz: float
    channel: str | None
    mean_power_w: float | None
    energy_j: float | None
    uncovered_s: float
    gaps: int

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def energy_channel(view: SourceView) -> str | None:
    for name, unit in zip(view.channel_names, view.units, strict=True):
        if unit == "J":
            return name
    return None


def integrate_power(view: SourceView, channel: str) -> tuple[float, float, float]:
    """(energy J, covered seconds, uncovered seconds) over the whole source, never bridged.

    The same streaming integration as ``wattlab energy`` (``alignment.integrate_view``).
    """
    first, last = span_s(view)
    cum = integrate_view(view, [channel], [first, last])[0]
    uncovered_s = float(cum.uncovered_s[-1])
    return float(cum.integral[-1]), (last - first) - uncovered_s, uncovered_s


def summarise_source(run: Run, view: SourceView) -> SourceSummary:
    n = len(view)
    duration_s = 0.0
    if n:
        first, last = view.first_last_ns()
        duration_s = float(last - first) / 1e9
    rate_hz = (n - 1) / duration_s if duration_s > 0 else 0.0
    gaps = sum(1 for g in run.gaps if g.source == view.source_id)
    channel = power_channel(view)
    mean_w = energy_j = None
    uncovered_s = 0.0
    if channel is not None and n > 1:
        energy_j, covered_s, uncovered_s = integrate_power(view, channel)
        mean_w = energy_j / covered_s if covered_s > 0 else None
    elif (counter := energy_channel(view)) is not None and n > 1:
        column = view.channel(counter)
        energy_j = float(column[-1] - column[0])
        channel = counter
        mean_w = energy_j / duration_s if duration_s > 0 else None
    return SourceSummary(view.source_id, view.kind, view.model, n, duration_s, rate_hz,
                         channel, mean_w, energy_j, uncovered_s, gaps)


def summarise(run: Run) -> list[SourceSummary]:
    return [summarise_source(run, view) for view in run.sources.values()]


def format_table(rows: list[SourceSummary]) -> str:
    """A fixed-width table for the terminal."""
    header = (f"{'source':<18} {'samples':>9} {'rate Hz':>9} {'dur s':>7} "
              f"{'mean W':>9} {'energy J':>11} {'gaps':>5}  channel")
    lines = [header, "-" * len(header)]
    for r in rows:
        mean = f"{r.mean_power_w:9.2f}" if r.mean_power_w is not None else f"{'-':>9}"
        energy = f"{r.energy_j:11.2f}" if r.energy_j is not None else f"{'-':>11}"
        lines.append(f"{r.source_id:<18} {r.samples:>9} {r.rate_hz:>9.2f} {r.duration_s:>7.2f} "
                     f"{mean} {energy} {r.gaps:>5}  {r.channel or '-'}")
    return "\n".join(lines)
