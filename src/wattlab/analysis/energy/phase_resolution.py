"""Which streams can resolve a phase; energy per group of phases no stream resolves.

Why: a stream places a phase edge only to within its sample spacing (half a spacing per
edge), a counter to its update period and reads, and a smoothed reading lags the load
(PROTOCOLS.md §7, H100: the 50 Hz samples ~25 ms, the "instant" field ~65 ms, the 1 s
average ~550 ms). An edge can move ``edge_s`` of the phase's power across it, so a phase
shorter than ``RESOLVE_EDGES`` edge times is not resolved by that stream: its number is
kept but flagged, each phase's energy is taken from a stream that resolves it, and
instances of a name no stream resolves (3 ms host-time steps, 20 ms steps on a 1 Hz
reading) are summed per enclosing phase (all steps of an epoch) where they tile it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wattlab.analysis.energy.source_energy import EnergyRow, Phase

RESOLVE_EDGES = 4.0  # a phase is resolved when it lasts this many edge times
GROUP_MIN_COVER = 0.9  # instances must fill this much of their group's span
# lag behind a load step by what the channel is (its ``meaning`` or name), PROTOCOLS.md §7
LAG_S = {"samples_power_w": 0.025, "instant_power_w": 0.065, "average_power_w": 0.55}


def channel_lag_s(meaning: str, channel: str) -> float:
    """How late a channel follows the load (0 where not known: an external meter)."""
    return LAG_S.get(meaning, LAG_S.get(channel, 0.0))


def power_edge_s(spacing_s: float, lag_s: float) -> float:
    """A sampled power stream: half a spacing either side of an edge, plus its lag."""
    return spacing_s / 2 + lag_s


def counter_row_edge_s(row: EnergyRow) -> float | None:
    """A counter row: its interval is all edges (``counter_energy``), in time."""
    if row.uncertainty_j is None or not row.mean_power_w:
        return None
    return row.uncertainty_j / (2 * abs(row.mean_power_w))


def annotate(rows: Sequence[EnergyRow], phases: Sequence[Phase],
             power_edges_s: dict[tuple[str, str], float]) -> None:
    """Set each row's ``edge_s`` and ``resolves``, with a note where it does not.

    ``power_edges_s``: the edge time of each power stream (``power_edge_s``); counter
    rows take theirs from their own interval.
    """
    duration = {p.label: p.duration_s for p in phases}
    for row in rows:
        row.edge_s = (counter_row_edge_s(row) if row.method == "counter"
                      else power_edges_s.get((row.source, row.channel)))
        if row.edge_s is None or row.energy_j is None:
            continue
        need = RESOLVE_EDGES * row.edge_s
        row.resolves = duration[row.phase] >= need
        if not row.resolves:
            row.notes.append(f"phase of {duration[row.phase]:.3f} s is shorter than this "
                             f"stream resolves ({need:.3f} s: {RESOLVE_EDGES:g} x its "
                             f"{row.edge_s * 1e3:.0f} ms edge)")


@dataclass
class Choice:
    """The stream whose energy stands for one phase, and why."""

    phase: str
    stream: str | None
    energy_j: float | None
    uncertainty_j: float | None
    reason: str
    valid: bool | None = None  # the chosen figure's verdict (docs/validity.md)


def choose(rows: Sequence[EnergyRow], phases: Sequence[Phase], reference: str | None
           ) -> list[Choice]:
    """The stream standing for each phase.

    The reference if it resolves the phase, else the resolving stream with the shortest
    edge; none where no stream resolves it (see ``group_rows``).
    """
    by_phase: dict[str, list[EnergyRow]] = {}
    for r in rows:
        if r.energy_j is not None:
            by_phase.setdefault(r.phase, []).append(r)
    out = []
    for p in phases:
        mine = by_phase.get(p.label, [])
        good = sorted((r for r in mine if r.resolves), key=lambda r: r.edge_s or 0.0)
        ref = [r for r in good if f"{r.source}:{r.channel}" == reference]
        if ref or good:
            r = (ref or good)[0]
            why = "the reference" if ref else f"edge {1e3 * (r.edge_s or 0):.0f} ms"
            out.append(Choice(p.label, f"{r.source}:{r.channel}", r.energy_j,
                              r.uncertainty_j, why, r.valid))
        elif mine:
            shortest = min(RESOLVE_EDGES * (r.edge_s or 0.0) for r in mine)
            out.append(Choice(p.label, None, None, None,
                              f"{p.duration_s:.3f} s is shorter than any stream resolves "
                              f"(>= {shortest:.3f} s)"))
    return out


def _parent(p: Phase, others: Sequence[Phase]) -> Phase | None:
    """The shortest of ``others`` (phases of other names) that holds ``p``.

    For a step: its epoch, else the run.
    """
    holders = [q for q in others if q.t0_s <= p.t0_s and p.t1_s <= q.t1_s]
    return min(holders, key=lambda q: q.duration_s, default=None)


def unresolved_names(rows: Sequence[EnergyRow], phases: Sequence[Phase]) -> list[str]:
    """Phase names whose typical (median) instance no stream resolves."""
    out = []
    for name in dict.fromkeys(p.name for p in phases):
        labels = sorted((p for p in phases if p.name == name), key=lambda p: p.duration_s)
        mid = labels[len(labels) // 2].label
        if not any(r.resolves for r in rows if r.phase == mid):
            out.append(name)
    return out


def group_rows(rows: Sequence[EnergyRow], phases: Sequence[Phase]
               ) -> tuple[list[Phase], list[EnergyRow], list[str]]:
    """Instances of each unresolved name summed per enclosing phase, as new phases and rows.

    A group counts only where its instances fill ``GROUP_MIN_COVER`` of the span from the
    first's start to the last's end: then the inner edges move energy between neighbours,
    not out of the group, and only the outer two edges and the time between instances
    count against it. Otherwise a note says why there is no number.
    """
    from wattlab.analysis.energy.source_energy import Phase

    new_phases: list[Phase] = []
    new_rows: list[EnergyRow] = []
    notes: list[str] = []
    for name in unresolved_names(rows, phases):
        groups: dict[str, tuple[Phase, list[Phase]]] = {}
        others = [q for q in phases if q.name not in (name, "window")]
        for p in phases:
            parent = _parent(p, others) if p.name == name else None
            if parent is not None:
                groups.setdefault(parent.label, (parent, []))[1].append(p)
        for parent, members in groups.values():
            t0, t1 = min(m.t0_s for m in members), max(m.t1_s for m in members)
            inside = sum(m.duration_s for m in members)
            cover = inside / (t1 - t0) if t1 > t0 else 0.0
            if cover < GROUP_MIN_COVER:
                notes.append(f"{len(members)} {name!r} phase(s) in {parent.label} fill only "
                             f"{100 * cover:.0f} % of their span: no stream resolves them, "
                             "even summed")
                continue
            group = Phase(f"{name} per {parent.name}", parent.index, t0, t1, parent.source,
                          members[0].clock)
            new_phases.append(group)
            labels = {m.label for m in members}
            per_stream: dict[tuple[str, str, str], list[EnergyRow]] = {}
            for r in rows:
                if r.phase in labels and r.energy_j is not None:
                    per_stream.setdefault((r.source, r.channel, r.method), []).append(r)
            for (_, _, method), part in per_stream.items():
                if len(part) == len(members):
                    new_rows.append(_sum_row(part, group, method, t1 - t0 - inside))
    return new_phases, new_rows, notes


def _sum_row(part: Sequence[EnergyRow], group: Phase, method: str, between_s: float
             ) -> EnergyRow:
    from wattlab.analysis.energy.source_energy import EnergyRow

    energy = sum(r.energy_j or 0.0 for r in part)
    covered = sum(r.covered_s for r in part)
    mean = energy / max(sum(r.covered_s + r.uncovered_s for r in part), 1e-12)
    edge = max(r.edge_s or 0.0 for r in part)
    half = abs(mean) * (2 * edge + between_s)
    row = EnergyRow(part[0].source, part[0].channel, method, group.label, group.t0_s,
                    group.t1_s, energy, mean, half, energy - half, energy + half,
                    sum(r.measured_j or 0.0 for r in part), covered,
                    sum(r.uncovered_s for r in part), sum(r.gaps for r in part))
    row.edge_s, row.resolves = edge, group.duration_s >= RESOLVE_EDGES * edge
    row.parts = [r.phase for r in part]
    row.notes.append(f"sum of {len(part)} phases no stream resolves one by one; interval: "
                     f"the group's two outer edges and {between_s:.3f} s between phases")
    return row
