"""`wattlab energy RUN --per UNIT`: joules per unit of work over the run and per phase.

Each phase's energy is the figure `wattlab energy --by-marker` chooses for it, with its
interval and verdict; the work is the counter's increase over the phase with its edge ±
(``counters``). J/unit's ± adds both relative errors in quadrature. The marginal figure
takes idle power times the phase's duration off first; idle is given, or measured where
no counted work ran (``idle_busy``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from wattlab.analysis.attribution.counters import CounterSeries, find_counter, run_counters
from wattlab.analysis.attribution.learn import measure_idle
from wattlab.analysis.attribution.power_stream import PowerStream, run_power_stream
from wattlab.analysis.energy import energy_report, invalid_reasons
from wattlab.runfile import Run

IDLE_MIN_S = 1.0  # a stretch without counted work shorter than this is not idle


@dataclass
class UnitRow:
    """One phase: energy, work, J per unit (total and above idle), each with its ±."""

    phase: str
    t0_s: float
    t1_s: float
    stream: str | None
    energy_j: float | None
    energy_pm_j: float | None
    units: float
    units_pm: float
    j_per_unit: float | None
    j_per_unit_pm: float | None
    marginal_j_per_unit: float | None
    marginal_j_per_unit_pm: float | None
    valid: bool
    invalid_reasons: list[str]
    notes: list[str] = field(default_factory=list)


@dataclass
class PerUnit:
    """J per unit of one run: the counter used, idle, one row per phase."""

    path: str
    unit: str
    counter: CounterSeries
    idle_w: float | None
    idle_pm_w: float | None
    idle_how: str
    rows: list[UnitRow]
    notes: list[str]

    @property
    def valid(self) -> bool:
        return all(r.valid for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "unit": self.unit, "counter": self.counter.to_json(),
                "idle_w": self.idle_w, "idle_pm_w": self.idle_pm_w, "idle_how": self.idle_how,
                "valid": self.valid, "rows": [asdict(r) for r in self.rows],
                "notes": self.notes}


def idle_busy(counter: CounterSeries, phases: Sequence[dict[str, Any]]
              ) -> list[tuple[float, float]]:
    """Where work ran: read intervals the counter advanced in; for counts, their span.

    A count marks work that ended then, not where it ran: the span from the first count to
    the last, and the innermost marked phases holding a count, are busy (not a phase that
    holds another such phase: the recorder's ``session`` holds the whole program).
    """
    t, v = counter.t_s, counter.value
    if not counter.exact:
        return [(float(t[i]), float(t[i + 1])) for i in range(t.size - 1) if v[i + 1] > v[i]]
    holding = [(p["t0_s"], p["t1_s"]) for p in phases if p["name"] != "run"
               and np.any((t >= p["t0_s"]) & (t <= p["t1_s"]))]
    inner = [a for a in holding if not any(b != a and a[0] <= b[0] and b[1] <= a[1]
                                           for b in holding)]
    return [(float(t[0]), float(t[-1])), *inner]


def run_idle(stream: PowerStream, counter: CounterSeries, idle_w: float | None,
             phases: Sequence[dict[str, Any]]) -> tuple[float | None, float | None, str]:
    """(idle W, ± W, how it was obtained)."""
    if idle_w is not None:
        return idle_w, 0.0, "given (--idle-w)"
    got = measure_idle(stream.t_s, stream.power_w, idle_busy(counter, phases),
                       guard_s=max(stream.edge_s, 0.1), min_s=IDLE_MIN_S)
    if got is None:
        return None, None, (f"not measured: no stretch of >= {IDLE_MIN_S:g} s without counted "
                            "work (give --idle-w)")
    return got[0], got[1], (f"measured on {stream.name} over {got[2]:.2f} s where "
                            "no counted work ran")


def energy_per_unit(run: Run, unit: str, *, idle_w: float | None = None) -> PerUnit:
    """J per ``unit`` (a counter's name, or tokens/requests/samples) per phase of ``run``."""
    counter = find_counter(run_counters(run), unit, run.path)
    report = energy_report(run, by_marker=True)
    stream = run_power_stream(run, report)
    idle, idle_pm, how = run_idle(stream, counter, idle_w, report["phases"])
    by_key = {(r["phase"], f"{r['source']}:{r['channel']}"): r for r in report["rows"]
              + report["group_rows"]}
    phases = {p["label"]: p for p in report["phases"] + report["groups"]}
    rows = [unit_row(phases[c["phase"]], c, by_key.get((c["phase"], c["stream"])), counter,
                     idle_w=idle, idle_pm_w=idle_pm)
            for c in report["chosen"] if c["phase"] in phases]
    notes = [f"{counter.name} reset (counted from 0 after) at "
             + ", ".join(f"{t:.3f} s" for t in counter.resets_s)] if counter.resets_s else []
    if counter.failed_reads:
        notes.append(f"{counter.name}: {counter.failed_reads} failed read(s) (gap rows): the "
                     "work across them is interpolated, its ± the increment over the gap")
    return PerUnit(run.path, unit, counter, idle, idle_pm, how, rows, notes)


def unit_row(phase: dict[str, Any], chosen: dict[str, Any], row: dict[str, Any] | None,
             counter: CounterSeries, *, idle_w: float | None, idle_pm_w: float | None
             ) -> UnitRow:
    """One phase's figures (``chosen``: `energy`'s figure for it; ``row``: its stream's row)."""
    t0, t1 = phase["t0_s"], phase["t1_s"]
    units, units_pm, notes = counter.increase(t0, t1)
    e, e_pm = chosen["energy_j"], chosen["uncertainty_j"]
    out = UnitRow(chosen["phase"], t0, t1, chosen["stream"], e, e_pm, units, units_pm, None,
                  None, None, None, bool(chosen["valid"]),
                  invalid_reasons(row) if row else [chosen["reason"]], notes)
    if e is None or units <= 0:
        out.notes.append("no energy figure" if e is None else f"no {counter.name} counted")
        return out
    rel_units = units_pm / units
    out.j_per_unit, out.j_per_unit_pm = e / units, e / units * _hypot(e_pm / e if e else 0,
                                                                    rel_units)
    if idle_w is not None:
        marginal = e - idle_w * (t1 - t0)
        m_pm = math.hypot(e_pm or 0.0, (idle_pm_w or 0.0) * (t1 - t0))
        out.marginal_j_per_unit = marginal / units
        out.marginal_j_per_unit_pm = abs(marginal / units) * _hypot(
            m_pm / abs(marginal) if marginal else 0.0, rel_units)
    return out


def _hypot(*relative: float | None) -> float:
    return math.sqrt(sum((r or 0.0) ** 2 for r in relative))


def format_per_unit(result: PerUnit, lines: Sequence[str] = ()) -> str:
    """A table: one line per phase, J per unit total and above idle, then notes."""
    c = result.counter
    idle = "-" if result.idle_w is None else f"{result.idle_w:.1f} ± {result.idle_pm_w:.1f} W"
    out = [*lines, f"unit: {c.name} [{c.unit}] ({c.origin}, {c.t_s.size} reads)",
           f"idle: {idle} ({result.idle_how})",
           f"{'phase':<16} {'energy J':>10} {'± J':>7} {'units':>9} {'±':>6} "
           f"{'J/unit':>10} {'±':>8} {'above idle':>10} {'±':>8} valid"]

    def num(x: float | None, w: int, d: int) -> str:
        return f"{x:{w}.{d}f}" if x is not None else f"{'-':>{w}}"

    for r in result.rows:
        out.append(f"{r.phase:<16} {num(r.energy_j, 10, 2)} {num(r.energy_pm_j, 7, 2)} "
                   f"{r.units:9.0f} {r.units_pm:6.0f} {num(r.j_per_unit, 10, 4)} "
                   f"{num(r.j_per_unit_pm, 8, 4)} {num(r.marginal_j_per_unit, 10, 4)} "
                   f"{num(r.marginal_j_per_unit_pm, 8, 4)} {'yes' if r.valid else 'NO'}")
        out += [f"  ! {why}" for why in r.invalid_reasons]
    out += [f"note: {n}" for r in result.rows for n in r.notes] + [
        f"note: {n}" for n in result.notes]
    return "\n".join(out)
