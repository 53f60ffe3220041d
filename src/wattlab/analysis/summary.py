"""Per-source summary of a run: samples, rate, duration, mean power, energy, gaps.

Energy is integrated piecewise (trapezoids) in chunks, and never across a hole: where two
samples are further apart than ``GAP_FACTOR`` times the median spacing, the interval is
left out and reported as uncovered time instead of being bridged silently.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from wattlab.analysis.run_file import Run, SourceView

GAP_FACTOR = 5.0
PREFERRED_POWER_CHANNELS = ("power_total_w", "power_w")


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


def power_channel(view: SourceView) -> str | None:
    """The channel that is the source's power draw.

    A source names it in ``config["power_channel"]`` (null: it measures no power, e.g. a
    stream whose only watts are a power *limit*); otherwise a preferred name, else the
    first channel in W.
    """
    config = view.descriptor.get("config", {})
    if "power_channel" in config:
        chosen = config["power_channel"]
        return chosen if chosen in view.channel_names else None
    for name in PREFERRED_POWER_CHANNELS:
        if name in view.channel_names and view.unit(name) == "W":
            return name
    for name, unit in zip(view.channel_names, view.units, strict=True):
        if unit == "W":
            return name
    return None


def energy_channel(view: SourceView) -> str | None:
    for name, unit in zip(view.channel_names, view.units, strict=True):
        if unit == "J":
            return name
    return None


def _median_spacing_ns(view: SourceView) -> float:
    diffs = np.diff(view.time_slice(0, 10_000))
    return float(np.median(diffs)) if diffs.size else 0.0


def integrate_power(view: SourceView, channel: str) -> tuple[float, float, float]:
    """(energy J, covered seconds, uncovered seconds), streaming through the datasets."""
    limit_ns = GAP_FACTOR * _median_spacing_ns(view)
    energy_j = covered_s = uncovered_s = 0.0
    prev_t: np.int64 | None = None
    prev_p = 0.0
    for chunk_t_ns, power in view.iter_chunks(channel):
        t_ns, p = chunk_t_ns, power.astype(np.float64)
        if prev_t is not None:
            t_ns = np.concatenate(([prev_t], t_ns))
            p = np.concatenate(([prev_p], p))
        dt_s = np.diff(t_ns) / 1e9
        mid_w = 0.5 * (p[1:] + p[:-1])
        ok = (dt_s * 1e9 <= limit_ns) & np.isfinite(mid_w)
        energy_j += float(np.sum(mid_w[ok] * dt_s[ok]))
        covered_s += float(np.sum(dt_s[ok]))
        uncovered_s += float(np.sum(dt_s[~ok]))
        prev_t, prev_p = t_ns[-1], float(p[-1])
    return energy_j, covered_s, uncovered_s


def summarise_source(run: Run, view: SourceView) -> SourceSummary:
    n = len(view)
    duration_s = 0.0
    if n:
        first, last = view.time_slice(0, 1)[0], view.time_slice(n - 1, n)[0]
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
