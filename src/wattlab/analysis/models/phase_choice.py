"""Phase-level choice: the best setting for each marked phase of a swept workload.

Why: a workload's phases differ (a memory-bound load, a compute-bound step), so the best
power limit or clock of each phase can differ from the whole run's best. Where a sweep's
runs carry begin/end markers (``wattlab.phase(...)``), the sweep file stores the energy and
time of every phase in every run; this module averages them over repeats per setting,
picks per phase the setting with the lowest objective whose phase time stays within the
slowdown bound of the default setting's, and compares "each phase at its own best" with
"the whole run at the single best setting" (switching costs are not modelled).

The choice is made on measured means, not a model: a phase is seen at few settings and
its error bar (standard error over repeats, where there are repeats) is shown with it.

Each phase's energy comes from a source that resolves its instances (``resolution``): a
0.2 s step from the 50 Hz samples, not from the 1 s average, whose lag spreads a step's
energy over its neighbours. Where none does, the default source is used and a note says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis.energy import COUNTER_UPDATE_S
from wattlab.analysis.energy import phase_resolution as resolution
from wattlab.analysis.models.sweep_results import SweepTable
from wattlab.errors import UsageError

FloatArray = npt.NDArray[np.float64]
OBJECTIVES = ("energy", "edp", "time")


@dataclass
class PhaseSetting:
    """One phase at one setting: means over the repeats that measured it."""

    x: float
    n: int
    time_s: float
    energy_j: float
    energy_se_j: float | None
    objective: float


@dataclass
class PhaseResult:
    """The best setting of one phase for the objective under the slowdown bound."""

    phase: str
    default_x: float
    best_x: float
    slowdown: float
    saving: float
    saving_se: float | None
    settings: list[PhaseSetting]
    energy_source: str = ""

    def to_json(self) -> dict[str, Any]:
        return _finite(asdict(self))


@dataclass
class PhaseReport:
    """Per-phase choices and the gain of choosing per phase over one whole-run setting."""

    origin: str
    x_name: str
    objective: str
    max_slowdown: float | None
    energy_source: str
    phases: list[PhaseResult]
    common_settings: list[float]
    single_best_x: float | None
    single_objective: float | None
    per_phase_objective: float | None
    default_objective: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def extra_saving(self) -> float | None:
        """How much lower the per-phase objective is than the single best setting's."""
        if self.single_objective is None or self.per_phase_objective is None:
            return None
        return 1.0 - self.per_phase_objective / self.single_objective

    def to_json(self) -> dict[str, Any]:
        out = _finite({k: v for k, v in asdict(self).items() if k != "phases"})
        out["phases"] = [p.to_json() for p in self.phases]
        out["extra_saving"] = self.extra_saving
        return out


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """NaN as null, so the JSON is valid for every reader."""
    def fix(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return {k: fix(v) for k, v in d.items()}


def _objective(objective: str, t: float, e: float) -> float:
    return {"energy": e, "edp": e * t, "time": t}[objective]


def _pick(settings: list[PhaseSetting], default: float,
          max_slowdown: float | None) -> tuple[PhaseSetting, PhaseSetting]:
    """(best, default): lowest objective whose time is within the bound of the default's."""
    ref = next(s for s in settings if s.x == default)
    ok = [s for s in settings
          if max_slowdown is None or s.time_s <= ref.time_s * (1 + max_slowdown) + 1e-12]
    return min(ok or [ref], key=lambda s: s.objective), ref


# how far in time each sweep energy source may misplace an edge (``resolution``): sample
# spacing / 2 plus the lag behind a load step (PROTOCOLS.md §7); the counter's update period
SOURCE_EDGE_S = {
    "nvml_samples": resolution.power_edge_s(0.02, resolution.LAG_S["samples_power_w"]),
    "nvml_instant": resolution.power_edge_s(0.09, resolution.LAG_S["instant_power_w"]),
    "nvml_average": resolution.power_edge_s(0.09, resolution.LAG_S["average_power_w"]),
    "nvml_energy": COUNTER_UPDATE_S,
}


def phase_source(instance_s: float, default: str, available: list[str]
                 ) -> tuple[str, str | None]:
    """(source, note): the source for a phase whose instances last ``instance_s``.

    The default if it resolves them, else the one with the shortest edge that does; the
    default, with a note, where none does.
    """

    def resolves(src: str) -> bool:
        return instance_s >= resolution.RESOLVE_EDGES * SOURCE_EDGE_S.get(src, 0.0)

    if resolves(default):
        return default, None
    good = sorted((s for s in available if resolves(s)), key=lambda s: SOURCE_EDGE_S.get(s, 0))
    if good:
        return good[0], (f"instances of {instance_s:.3f} s are shorter than {default} "
                         f"resolves: energy from {good[0]}")
    return default, (f"instances of {instance_s:.3f} s are shorter than any energy source "
                     f"resolves: {default} used, its phase energies are rough")


def choose_per_phase(table: SweepTable, objective: str = "energy",
                     max_slowdown: float | None = None,
                     energy_source: str | None = None) -> PhaseReport:
    """Best setting per phase of a sweep whose runs marked phases (see module doc)."""
    if objective not in OBJECTIVES:
        raise UsageError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if max_slowdown is not None and max_slowdown < 0:
        raise UsageError(f"--max-slowdown must be >= 0, got {max_slowdown}")
    ph = table.phases
    if ph is None or len(ph) == 0:
        raise UsageError(f"{table.origin}: this sweep has no phases: the workload marked none "
                         "(use wattlab.phase(...) in it) or the file predates per-phase rows")
    source = energy_source or (table.energy_source if table.energy_source in ph.energies_j
                               else next(iter(ph.energies_j), ""))
    if source not in ph.energies_j:
        raise UsageError(f"{table.origin}: phases have no energy source {source!r} "
                         f"(has {', '.join(ph.energies_j) or 'none'})")
    ok_run = np.array([s == "ok" for s in table.status], dtype=bool)
    x_of = table.x[ph.run]
    usable = ok_run[ph.run] & np.isfinite(ph.time_s) & (ph.time_s > 0) & np.isfinite(x_of)
    names = np.array(ph.phase, dtype=object)
    results: list[PhaseResult] = []
    notes: list[str] = []
    means: dict[str, dict[float, PhaseSetting]] = {}
    for name in ph.names():
        mine = usable & (names == name)
        instance_s = float(np.median(ph.time_s[mine] / np.maximum(ph.count[mine], 1))
                           ) if mine.any() else 0.0
        src, why = ((source, None) if energy_source is not None
                    else phase_source(instance_s, source, list(ph.energies_j)))
        if why:
            notes.append(f"phase {name!r}: {why}")
        energy = ph.energies_j[src]
        rows = np.flatnonzero(mine & np.isfinite(energy))
        if rows.size == 0:
            notes.append(f"phase {name!r}: no finished run measured it")
            continue
        per_x: dict[float, PhaseSetting] = {}
        for x in np.unique(x_of[rows]).tolist():
            r = rows[x_of[rows] == x]
            t, e = float(np.mean(ph.time_s[r])), float(np.mean(energy[r]))
            se = float(np.std(energy[r], ddof=1) / math.sqrt(r.size)) if r.size > 1 else None
            per_x[float(x)] = PhaseSetting(float(x), int(r.size), t, e, se,
                                           _objective(objective, t, e))
        means[name] = per_x
        settings = sorted(per_x.values(), key=lambda s: s.x)
        xs = [s.x for s in settings]
        default = (table.default_x if table.default_x is not None and table.default_x in xs
                   else max(xs))
        best, ref = _pick(settings, default, max_slowdown)
        saving = 1.0 - best.objective / ref.objective
        saving_se = None
        if objective == "energy" and best.energy_se_j is not None and ref.energy_se_j is not None:
            saving_se = math.hypot(best.energy_se_j / ref.energy_j,
                                   best.energy_j * ref.energy_se_j / ref.energy_j ** 2)
        results.append(PhaseResult(name, default, best.x, best.time_s / ref.time_s - 1.0,
                                   saving, saving_se, settings, src))
    common = sorted(set.intersection(*(set(m) for m in means.values()))) if means else []
    single_x = single_obj = per_phase_obj = default_obj = None
    if common and results:
        totals = [PhaseSetting(x, 1, sum(means[n][x].time_s for n in means),
                               sum(means[n][x].energy_j for n in means), None, 0.0)
                  for x in common]
        for s in totals:
            s.objective = _objective(objective, s.time_s, s.energy_j)
        default = results[0].default_x if results[0].default_x in common else max(common)
        best, ref = _pick(totals, default, max_slowdown)
        single_x, single_obj, default_obj = best.x, best.objective, ref.objective
        chosen = [means[r.phase][r.best_x] for r in results]
        per_phase_obj = _objective(objective, sum(c.time_s for c in chosen),
                                   sum(c.energy_j for c in chosen))
    else:
        notes.append("no setting measured every phase: no whole-run comparison")
    return PhaseReport(table.origin, table.x_name, objective, max_slowdown, source, results,
                       common, single_x, single_obj, per_phase_obj, default_obj, notes)


def format_phase_report(report: PhaseReport, unit: str) -> str:
    """Terminal lines: per phase the time and energy per setting, then the best setting."""
    bound = "none" if report.max_slowdown is None else f"{report.max_slowdown:g}"
    lines = [f"per-phase choice ({report.objective}, max slowdown {bound}, energy from "
             f"{report.energy_source}):"]
    for p in report.phases:
        se = "" if p.saving_se is None else f" ± {100 * p.saving_se:.1f}"
        src = "" if p.energy_source in ("", report.energy_source) else \
            f" [energy from {p.energy_source}]"
        lines.append(f"  phase {p.phase}: best {p.best_x:g} {unit} (default {p.default_x:g}) "
                     f"saves {100 * p.saving:.1f}{se} % for {100 * p.slowdown:+.1f} % time{src}")
        for s in p.settings:
            e_se = "" if s.energy_se_j is None else f" ± {s.energy_se_j:.2f}"
            mark = "  <- best" if s.x == p.best_x else ""
            lines.append(f"    {s.x:>8g} {unit}: {s.time_s:8.3f} s {s.energy_j:10.2f}{e_se} J "
                         f"(n={s.n}){mark}")
    if report.single_best_x is not None and report.extra_saving is not None:
        lines.append(f"whole run at one setting: best {report.single_best_x:g} {unit}; each "
                     f"phase at its own best: {100 * report.extra_saving:.1f} % lower "
                     f"{report.objective} than that (switching costs not included)")
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)
