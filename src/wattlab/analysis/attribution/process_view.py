"""The per-process split as a table: by process, by Slurm job, by pod; text, JSON and rows.

A job or pod sums its processes over every GPU (one process on several GPUs is one row
per GPU); processes without one are grouped as "(no job)" / "(no pod)". Its ± is not its
processes' ± combined: the rule's is the group's as one unit on each GPU (``group_pm_j``).
Where a GPU has no per-process stream, the reason is printed and no figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from wattlab.analysis.attribution.by_process import ByProcess, ProcessEnergy, energy_by_process
from wattlab.errors import UsageError
from wattlab.runfile import Run

PLURAL = {"process": "processes", "instance": "instances"}
GROUPS = {"process": None, "job": ("slurm_job", "(no job)"), "pod": ("pod_uid", "(no pod)")}
# `wattlab export --by-process`'s columns -> pyarrow type
PROCESS_COLUMNS = {
    "run": "string", "gpu": "int64", "process": "string", "pid": "int64", "comm": "string",
    "user": "string", "slurm_job": "string", "pod_uid": "string", "pod_name": "string",
    "pod_namespace": "string", "first_s": "float64", "last_s": "float64",
    "dynamic_j": "float64", "static_j": "float64", "idle_j": "float64", "energy_j": "float64",
    "pm_j": "float64", "rule_pm_j": "float64", "rule": "string", "stream": "string",
    "valid": "bool",
}


@dataclass
class Group:
    """A job's or pod's processes summed."""

    name: str
    detail: str
    processes: int
    dynamic_j: float
    static_j: float
    idle_j: float
    energy_j: float
    pm_j: float
    valid: bool


def figure_j(p: ProcessEnergy, value_j: float) -> str:
    """A table cell of ``p``'s joules: the bound it is known to, where it is unresolved.

    Never a negative energy printed as a result: a process draws no less than nothing.
    """
    if p.resolved:
        return f"{value_j:10.1f}"
    return f"{'≤ ' + format(max(value_j + p.pm_j, 0.0), '.1f'):>10}"


def group_by(result: ByProcess, by: str) -> list[Group]:
    """The processes summed per job or pod (``GROUPS``)."""
    key, none = GROUPS[by] or ("", "")
    groups: dict[str, list[ProcessEnergy]] = {}
    for p in result.processes:
        groups.setdefault(p.identity.get(key) or none, []).append(p)
    out = []
    for name, ps in groups.items():
        detail = ""
        if by == "pod" and name != none:
            ns, pod = ps[0].identity.get("pod_namespace"), ps[0].identity.get("pod_name")
            detail = f"{ns}/{pod}" if pod else ""
        out.append(Group(name, detail, len(ps), sum(p.dynamic_j for p in ps),
                         sum(p.static_j for p in ps), sum(p.idle_j for p in ps),
                         sum(p.energy_j for p in ps), group_pm_j(result, ps),
                         all(p.valid for p in ps)))
    return sorted(out, key=lambda g: -g.energy_j)


def group_pm_j(result: ByProcess, ps: list[ProcessEnergy]) -> float:
    """A group's ±: its sampling and its rule ± as one unit (``RuleError``), in quadrature.

    Sampling adds up: each process's is its share of its GPU's stream ± (a gain-like error
    of the stream, the same sign for every part of it), so within a GPU the shares' errors
    move together; across GPUs the sum is the bound. The rule's: per GPU, the group's as
    one unit, so joules the zero-sum split moves between two of its processes cancel; a
    group holding every working process of a GPU has none there, and a group of one process
    has that process's rule ±. Across GPUs the rule's scatter (separate fits) in
    quadrature, the late reads' shortfalls added whole, as each process's are. The
    baseline's (idle + static measured per GPU): the group's move as one, GPUs in quadrature.
    """
    keys = {p.key for p in ps}
    scatter_j = late_j = baseline_j = 0.0
    for g in result.gpus:
        mine = [p.key for p in g.processes if p.key in keys]
        if mine and g.rule_error is not None:
            scatter_j = math.hypot(scatter_j, g.rule_error.scatter_j(mine))
            late_j += g.rule_error.late_j(mine)
            baseline_j = math.hypot(baseline_j, g.rule_error.baseline_j(mine))
    return math.hypot(sum(p.sampling_pm_j for p in ps), scatter_j + late_j, baseline_j)


def by_process_json(result: ByProcess, by: str) -> dict[str, Any]:
    out = result.to_json()
    if by != "process":
        out["groups"] = {"by": by, "rows": [vars(g) for g in group_by(result, by)]}
    return out


def format_by_process(result: ByProcess, by: str = "process") -> str:
    """Per GPU: the total and its parts, the rule; then one line per process (or group)."""
    lines = [f"no per-process figure for {why}" for why in result.missing]
    for g in result.gpus:
        b, r = g.baseline, g.rule
        lines += [f"{g.prefix}: {g.total_j:.1f} J ({g.total_how})",
                  f"  stream: {g.stream.name} (valid: {'yes' if g.stream.valid else 'NO'})"]
        lines += [f"  ! {why}" for why in g.stream.invalid_reasons]
        lines += [f"  idle {b.idle_w:.1f} ± {b.idle_pm_w:.1f} W: {b.idle_how}"
                  + ("" if b.idle_measured else " [NOT MEASURED]"),
                  f"  static {b.static_w:.1f} ± {b.static_pm_w:.1f} W: {b.static_how}",
                  f"  rule: {r.name}: {r.description}"]
        lines += [f"    w_{k} = {p.value:.4g}" + (f" ± {p.pm:.2g}" if p.pm else "")
                  + f" {p.unit}" for k, p in r.weights.items()]
        lines += [f"    {n}" for n in r.notes] + [f"  ! {c}" for c in r.caveats]
        lines += [f"  note: {n}" for n in g.notes]
        charged, units = ", ".join(result.charge) or "neither", PLURAL[result.unit]
        lines.append(f"  = {units} {sum(p.energy_j for p in g.processes):.1f} J + static "
                     f"{g.static_j:.1f} J + idle {g.idle_j:.1f} J + no process active "
                     f"{g.unattributed_j:.1f} J (charged to {units}: {charged})")
    if not result.gpus:
        return "\n".join(lines)
    if by == "process":
        truth = any(p.truth_dynamic_j is not None for p in result.processes)
        lines.append(f"{result.unit:<28} {'present s':>15} {'dynamic J':>10} {'static J':>9} "
                     f"{'idle J':>8} {'energy J':>10} {'± J':>8} {'rule ±':>8} valid"
                     + ("    truth J" if truth else ""))
        for p in sorted(result.processes, key=lambda p: -p.energy_j):
            t = p.truth_dynamic_j
            lines.append(f"{p.label[:28]:<28} {p.present_s[0]:7.2f}–{p.present_s[1]:<7.2f} "
                         f"{figure_j(p, p.dynamic_j)} {p.static_j:9.1f} {p.idle_j:8.1f} "
                         f"{figure_j(p, p.energy_j)} {p.pm_j:8.1f} {p.rule_pm_j:8.1f} "
                         f"{'yes' if p.valid else 'NO ':<5}"
                         + (f" {'-' if t is None else f'{t:10.1f}'}" if truth else ""))
        bad = {why for p in result.processes for why in p.invalid_reasons}
        lines += [f"  ! {why}" for why in sorted(bad)]
        lines += [f"  ! {p.label}: its dynamic energy ({p.dynamic_j:.1f} ± {p.pm_j:.1f} J by the "
                  "rule) cannot be told from zero by this run: printed as the bound it is known "
                  "to; the rule's figure stays in JSON so the parts still add up"
                  for p in result.processes if not p.resolved]
        return "\n".join(lines)
    lines.append(f"{by:<28} {'procs':>5} {'dynamic J':>10} {'static J':>9} {'idle J':>8} "
                 f"{'energy J':>10} {'± J':>8} valid")
    for grp in group_by(result, by):
        name = grp.name + (f" ({grp.detail})" if grp.detail else "")
        lines.append(f"{name[:28]:<28} {grp.processes:5d} {grp.dynamic_j:10.1f} "
                     f"{grp.static_j:9.1f} {grp.idle_j:8.1f} {grp.energy_j:10.1f} "
                     f"{grp.pm_j:8.1f} {'yes' if grp.valid else 'NO'}")
    return "\n".join(lines)


def process_rows(path: str) -> list[dict[str, Any]]:
    """One table row per process of a run file (`wattlab export --by-process`)."""
    with Run(path) as run:
        result = energy_by_process(run)
    if not result.gpus:
        raise UsageError(f"{path}: no per-process figure: " + "; ".join(result.missing))
    rows = []
    for g in result.gpus:
        for p in g.processes:
            i = p.identity
            rows.append({"run": path, "gpu": g.gpu, "process": p.key, "pid": i["pid"],
                         "comm": i.get("comm"), "user": i.get("user"),
                         "slurm_job": i.get("slurm_job"), "pod_uid": i.get("pod_uid"),
                         "pod_name": i.get("pod_name"), "pod_namespace": i.get("pod_namespace"),
                         "first_s": p.present_s[0], "last_s": p.present_s[1],
                         "dynamic_j": p.dynamic_j, "static_j": p.static_j, "idle_j": p.idle_j,
                         "energy_j": p.energy_j, "pm_j": p.pm_j, "rule_pm_j": p.rule_pm_j,
                         "rule": g.rule.name, "stream": g.stream.name, "valid": p.valid})
    return rows
