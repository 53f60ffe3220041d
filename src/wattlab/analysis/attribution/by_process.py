"""`wattlab energy RUN --by-process`: each process's share of its GPU's energy.

docs/process-energy.md says what the parts and rules are.

Per GPU (keyed by its stream prefix: ``gpu0``, or ``node1.gpu0`` on a multi-node run):
idle and static apart (``process_parts``); the dynamic rest shared by the
attribution core among the processes' utilisation samples by a rule:

- ``activity``: each process's own power per unit of its activity, learnt where it worked
  alone in the run itself, else weights of kinds of work (SM %, memory %) fitted on the
  run (``process_rule``); where nothing can be fitted, Kepler's rule, said so.
- ``utilisation``: Kepler's: the dynamic power split by SM-utilisation share.

``unit="instance"``: a MIG GPU's instances in the processes' place (``gpu{i}.mig``, whose
driver gives no per-process utilisation), by the same rules (``read_instances``).

The parts are scaled to the GPU's energy counter where it has one (the power stream places
the joules in time, the counter says how many), so processes + static + idle +
unattributed = the counter's energy to ``CLOSURE`` (checked). Each process's ± is its
sampling share (the stream's ±) and the rule's own error: how badly the rule predicts the
power of intervals it was not fitted on (leave-one-out), times the dynamic energy from its
first working sample to its last, or over its whole presence where the GPU was time-sliced
(``process_rule.worked_spans``: the split is zero-sum, so what the rule mispredicts may be
any working process's; none for a GPU's only working process), with the weights' own ±
(``rule_moves``) in quadrature; plus, where the per-process stream's reads came late, the
dynamic energy they left to no process (``missed_by_late_reads``). ``GpuSplit.rule_error``
gives the same ± for any set of the GPU's processes: a job's or pod's
(``process_rule.RuleError``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from wattlab.analysis.attribution.by_request import RESOLVE_EDGES, rule_moves
from wattlab.analysis.attribution.core import CLOSURE, Activity, attribute
from wattlab.analysis.attribution.learn import prediction_error
from wattlab.analysis.attribution.power_stream import PowerStream, run_power_stream
from wattlab.analysis.attribution.process_parts import (
    Baseline,
    charge_shares,
    covered_s,
    measure_baseline,
    place_lone_edges,
)
from wattlab.analysis.attribution.process_rule import (
    KEPLER,
    RuleError,
    activity_rule,
    baseline_moves,
    clip,
    late_reads_note,
    missed_by_late_reads,
    share_window_s,
    worked_spans,
)
from wattlab.analysis.attribution.process_table import (
    ProcessTable,
    gpu_prefix,
    missing_reason,
    read_instances,
    read_processes,
)
from wattlab.analysis.attribution.rule import Param, Rule
from wattlab.analysis.energy import PROCESS_CHECK, energy_report, process_stream_check
from wattlab.runfile import Run

RULES = ("activity", "utilisation")
CHARGES = ("static", "idle")
ONE_AT_A_TIME = 0.5  # of the shared sample intervals naming one process: a time-sliced GPU


@dataclass
class ProcessEnergy:
    """One process on one GPU: its energy by part, each with its ±, and its verdict."""

    key: str
    label: str
    identity: dict[str, Any]
    present_s: tuple[float, float]
    samples: int
    dynamic_j: float
    static_j: float  # charged to it (0 unless --charge static)
    idle_j: float  # charged to it (0 unless --charge idle)
    energy_j: float
    sampling_pm_j: float
    rule_pm_j: float  # with the late reads' (``late_pm_j``) in it
    pm_j: float
    valid: bool
    invalid_reasons: list[str]
    checks: dict[str, Any]  # the power stream's named checks and ``processes``
    truth_dynamic_j: float | None = None  # a simulated GPU's own figure, where it gave one
    late_pm_j: float = 0.0  # the dynamic energy late reads left unseen beside it (its share)
    baseline_pm_j: float = 0.0  # its dynamic energy's move with idle + static by their ±

    @property
    def resolved(self) -> bool:
        """Whether the run tells its dynamic energy from none: not below zero, ± under it.

        The lent H200's pairs printed one process at -13.0 ± 133 J as a plain result.
        """
        return self.dynamic_j == 0.0 or self.pm_j < self.dynamic_j


@dataclass
class GpuSplit:
    """One GPU: the total and how it was obtained, the shared parts, the rule, the processes."""

    gpu: int
    stream: PowerStream
    baseline: Baseline
    rule: Rule
    total_j: float
    total_how: str
    idle_j: float  # left as its own part (not charged)
    static_j: float
    unattributed_j: float
    processes: list[ProcessEnergy]
    notes: list[str] = field(default_factory=list)
    node: str = ""  # the node's stream prefix on a multi-node run
    rule_error: RuleError | None = None  # the rule ± of any set of its processes (a job's)

    @property
    def prefix(self) -> str:
        return gpu_prefix(self.node, self.gpu)

    @property
    def closure_j(self) -> float:
        return (sum(p.energy_j for p in self.processes) + self.idle_j + self.static_j
                + self.unattributed_j - self.total_j)

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, **({"node": self.node} if self.node else {}),
                **self.stream.verdict_json(), **self.baseline.to_json(),
                "rule": self.rule.to_json(), "total_j": self.total_j,
                "total_how": self.total_how, "idle_j": self.idle_j, "static_j": self.static_j,
                "unattributed_j": self.unattributed_j, "closure_j": self.closure_j,
                "notes": self.notes,
                "processes": [asdict(p) | {"resolved": p.resolved} for p in self.processes]}


@dataclass
class ByProcess:
    """Every GPU's split, and why the GPUs without one have none."""

    path: str
    rule: str
    charge: tuple[str, ...]
    gpus: list[GpuSplit]
    missing: list[str]
    missing_gpus: list[str] = field(default_factory=list)  # each reason's GPU prefix
    unit: str = "process"  # or "instance": a MIG GPU's instances

    @property
    def processes(self) -> list[ProcessEnergy]:
        return [p for g in self.gpus for p in g.processes]

    @property
    def valid(self) -> bool:
        return all(p.valid for p in self.processes)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "unit": self.unit, "rule": self.rule,
                "charge": list(self.charge), "valid": self.valid, "missing": self.missing,
                "gpus": [g.to_json() for g in self.gpus]}


def run_gpus(run: Run) -> list[tuple[str, int]]:
    """The GPUs the run has streams of, as (node, index), one host's first, then by node.

    ("", i) for ``gpu{i}.*``; on a multi-node run (NODE, i) for ``NODE.gpu{i}.*``.
    """
    out = set()
    for sid in run.sources:
        parts = sid.split(".")
        # a node's prefix first: an agent may be named after a host called gpu7
        for node, head in ((parts[0], parts[1] if len(parts) > 2 else ""), ("", parts[0])):
            if head.startswith("gpu") and head[3:].isdigit():
                out.add((node, int(head[3:])))
                break
    return sorted(out)


def energy_by_process(run: Run, *, rule: str = "activity", charge: tuple[str, ...] = (),
                      unit: str = "process") -> ByProcess:
    """Each process's (or MIG instance's) energy on each GPU of ``run`` (module doc).

    ``unit="auto"``: instances where the run has MIG streams and no per-process stream (a
    job's or pod's share on a MIG GPU is its instances'), else processes.
    """
    if unit == "auto":
        ids = [sid.rsplit(".", 1)[-1] for sid in run.sources]
        unit = "instance" if "mig" in ids and "processes" not in ids else "process"
    read = read_instances if unit == "instance" else read_processes
    tables = {(node, gpu): read(run, gpu, node) for node, gpu in run_gpus(run)}
    missing = [(instance_missing if unit == "instance" else missing_reason)(run, gpu, node)
               for (node, gpu), t in tables.items() if t is None]
    found = [t for t in tables.values() if t is not None]
    report = energy_report(run, by_marker=False) if found else {}
    gpus = [split_gpu(run, report, t, rule, charge, unit=unit) for t in found]
    for g in gpus:
        add_truth(run, g, unit)
    return ByProcess(run.path, rule, charge, gpus, missing,
                     [gpu_prefix(node, gpu) for (node, gpu), t in tables.items() if t is None],
                     unit)


def instance_missing(run: Run, gpu: int, node: str = "") -> str:
    """Why a run has no per-instance stream of ``gpu``: the reader's words, else MIG off."""
    prefix = gpu_prefix(node, gpu)
    for sid, view in run.sources.items():
        why = (view.descriptor.get("config") or {}).get("missing", {}).get("mig")
        if sid.startswith(f"{prefix}.") and why:
            return f"{prefix}: no per-instance stream: {why}"
    return (f"{prefix}: no {prefix}.mig stream in {run.path} (MIG off: --by-process splits "
            "a GPU among its processes)")


def add_truth(run: Run, g: GpuSplit, unit: str = "process") -> None:
    """A simulated GPU's ``simulated-truth`` marker: each process's true dynamic energy.

    So that a split can be scored from the command line; the simulator's idle and static
    joules, and its window, go into the notes. For MIG instances, each instance's.
    """
    stream, field_name = (("mig", "instances_dynamic_j") if unit == "instance"
                          else ("processes", "dynamic_j"))
    marks = [m for m in run.markers if m.name == "simulated-truth"
             and m.source == f"{g.prefix}.{stream}"]
    if not marks:
        return
    truth = marks[-1].payload
    dyn = {str(k): float(v) for k, v in (truth.get(field_name) or {}).items()}
    for p in g.processes:
        p.truth_dynamic_j = dyn.get(f"gi{p.identity['gi']}" if unit == "instance"
                                    else str(p.identity["pid"]))
    g.notes.append(f"simulated truth over {truth.get('window_ns')} ns: idle "
                   f"{truth.get('idle_j')} J, static {truth.get('static_j')} J; each "
                   "process's in 'truth J'")


def choose_rule(stream: PowerStream, base_w: float, table: ProcessTable, name: str, *,
                sliced: bool) -> tuple[Rule, list[Activity], list[str]]:
    """The rule, the activities it shares by, and the kinds its error is checked on."""
    if name == "activity":
        return activity_rule(stream, base_w, table, RESOLVE_EDGES * stream.edge_s,
                             sliced=sliced, window_s=share_window_s(sliced))
    return (Rule("utilisation", KEPLER, {"sm": Param(1.0)}),
            [Activity(p.key, "sm", a, b, s) for p in table.processes
             for a, b, s in zip(p.t0_s, p.t1_s, p.sm, strict=True)], ["sm"])


def split_gpu(run: Run, report: dict[str, Any], table: ProcessTable, rule_name: str,
              charge: tuple[str, ...], *, unit: str = "process") -> GpuSplit:
    """One GPU's split on its run's power stream, to its energy counter where it has one.

    A process's edges where it came or went alone are placed by the power
    (``place_lone_edges``), and its rows read again with them.
    """
    stream = run_power_stream(run, report, table.prefix)
    if unit == "process":
        base = measure_baseline(stream, table)
        table = read_processes(run, table.gpu, table.node, lambda procs: place_lone_edges(
            procs, stream, base, table.edge_s)) or table
    return split(stream, table, rule_name, charge, gpu_counter(report, table.prefix))


def split(stream: PowerStream, table: ProcessTable, rule_name: str, charge: tuple[str, ...],
          counter: tuple[float, str] | None = None) -> GpuSplit:
    """One GPU's split over ``stream.run_s`` (module doc); ``counter``: (J, name) over it."""
    base = measure_baseline(stream, table)
    base_w = base.idle_w + base.static_w
    caveat = time_slicing_caveat(table)
    rule, acts, kinds = choose_rule(stream, base_w, table, rule_name, sliced=bool(caveat))
    if caveat:
        rule = Rule(rule.name, rule.description, rule.weights, rule.notes,
                    [*rule.caveats, caveat])
    att = attribute(stream.t_s, stream.power_w, base_w, acts, rule, span_s=stream.run_s)
    span = (att.t0_s, att.t1_s)
    present_s = covered_s([p.present_s for p in table.processes], *span)
    total, how, scale = gpu_total(counter, stream, att.total_j)
    loo = prediction_error(stream.t_s, stream.power_w, base_w, acts, kinds=kinds,
                           min_piece_s=RESOLVE_EDGES * stream.edge_s)
    late, late_s = missed_by_late_reads(stream, base_w, table, acts, rule)
    err = RuleError(loo, scale, stream, base_w, rule,
                    worked_spans(stream.run_s, table, sliced=bool(caveat)),
                    rule_moves(stream, base_w, acts, att), late,
                    baseline_moves(stream, base_w, base.base_pm_w, acts=acts, rule=rule, att=att))
    dyn = {k: e * scale for k, e in att.by_owner().items()}
    static_j = base.static_w * present_s * scale
    idle_j = base.idle_w * (span[1] - span[0]) * scale
    shares = charge_shares(table, span)
    sampling_rel = (stream.energy_pm_j or 0.0) / stream.energy_j if stream.energy_j else 0.0
    check = process_stream_check(table.source, table.gaps)
    reasons = stream.invalid_reasons + ([f"processes: {check.reason}"] if not check.ok else [])
    procs = []
    for p in table.processes:
        d = dyn.get(p.key, 0.0)
        s = static_j * shares.get(p.key, 0.0) if "static" in charge else 0.0
        i = idle_j * shares.get(p.key, 0.0) if "idle" in charge else 0.0
        e = d + s + i
        late_pm, rule_pm, base_pm = err.late_j([p.key]), err.pm_j([p.key]), err.baseline_j([p.key])
        procs.append(ProcessEnergy(p.key, p.label, p.identity, clip(p, span), len(p.t1_s), d,
                                   s, i, e, abs(e) * sampling_rel, rule_pm,
                                   math.hypot(abs(e) * sampling_rel, rule_pm, base_pm),
                                   stream.valid and check.ok, reasons,
                                   stream.checks | {PROCESS_CHECK: check.json},
                                   late_pm_j=late_pm, baseline_pm_j=base_pm))
    charged_s = sum(p.static_j for p in procs)
    charged_i = sum(p.idle_j for p in procs)
    notes = [*table.notes, f"window {span[0]:.3f}–{span[1]:.3f} s; processes present before "
             "or after it are clipped to it"]
    if loo is None:
        notes.append("the rule's own error could not be estimated (too few sample intervals "
                     "to leave one out): ± is the sampling's only")
    else:
        notes.append(f"the rule predicts the dynamic power of intervals left out of its fit "
                     f"to {100 * loo:.1f} % (RMS): each process's rule ± is that share of the "
                     "dynamic energy from its first working sample to its last (its presence "
                     "where the GPU was time-sliced), whoever it went to (the split is "
                     "zero-sum: what the rule mispredicts may be any working process's), with "
                     "the weights' ±")
    notes += late_reads_note(table, sum(s.unseen_j for s in late) * scale, late_s)
    out = GpuSplit(table.gpu, stream, base, rule, total, how, idle_j - charged_i,
                   static_j - charged_s,
                   (att.unattributed_j + base.static_w * (span[1] - span[0] - present_s))
                   * scale, procs, notes, table.node, err)
    if abs(out.closure_j) > CLOSURE * max(abs(total), 1e-12):
        raise RuntimeError(f"{table.prefix}: processes + static + idle + unattributed - total "
                           f"= {out.closure_j:.6g} J of {total:.6g} J (a bug in wattlab)")
    return out


def gpu_counter(report: dict[str, Any], prefix: str) -> tuple[float, str] | None:
    """The energy counter of the GPU ``prefix`` over the run, and its name (None: none)."""
    for r in report["rows"]:
        if (r["phase"] == "run" and r["method"] == "counter" and r["energy_j"] is not None
                and r["source"].startswith(f"{prefix}.")):
            return float(r["energy_j"]), f"{r['source']}:{r['channel']}"
    return None


def gpu_total(counter: tuple[float, str] | None, stream: PowerStream, integral_j: float
              ) -> tuple[float, str, float]:
    """The GPU's energy over the run, how it was obtained, and the integral's scale to it."""
    if counter is None or integral_j <= 0:
        return integral_j, f"the integral of {stream.name} (no energy counter)", 1.0
    scale = counter[0] / integral_j
    return (counter[0], f"the energy counter {counter[1]}; the parts, placed in time by "
            f"{stream.name}, scaled by its ratio to the integral ({scale:.4f})", scale)


def time_slicing_caveat(table: ProcessTable) -> str | None:
    """Where the driver named one process per sample while several worked: say what it means.

    On a time-sliced GPU each utilisation sample names the process that held the GPU then,
    with the device's utilisation: the split follows which process the driver named, not
    what each drew, and a process of small kernels is charged the power of the other's.
    """
    workers = [p for p in table.processes if p.active]
    if len(workers) < 2:
        return None
    stamps: dict[float, int] = {}
    spans = []  # each worker's first to last working sample
    for p in workers:
        on = [t for t, s, m in zip(p.t1_s, p.sm, p.mem, strict=True)
              if s + m > 0]
        spans.append((on[0], on[-1]))
        for t in on:
            stamps[t] = stamps.get(t, 0) + 1
    shared = [n for t, n in stamps.items() if sum(a <= t <= b for a, b in spans) >= 2]
    if not shared or sum(n == 1 for n in shared) / len(shared) <= ONE_AT_A_TIME:
        return None
    return (f"while several processes worked, {sum(n == 1 for n in shared)} of "
            f"{len(shared)} driver samples named one process only (a time-sliced GPU): each "
            "such sample carries the device's utilisation, so the split follows which process "
            "the driver named, not what each drew; a process of small kernels is charged "
            "power the other drew")
