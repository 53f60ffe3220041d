"""The node report: a run's energy split into GPU, CPU, DRAM and the wall, each joule once.

Why a report of its own: adding every stream of a run counts things twice (a riser and
NVML both measure the GPU; a package's ``core`` zone is part of the package; a GH200
module's counter already holds its CPU). The split reads what each stream's descriptor
says it covers and takes one stream per part:

- a GPU (one per UUID, however many streams or agents recorded it): its energy counter,
  or, where there is none, the power stream its reader chose, with the reason;
- CPU and DRAM: the RAPL ``package`` and ``dram`` zones (``core``/``uncore`` are parts of
  the package, ``psys`` covers the platform: listed, never added);
- the wall (``--wall``, or a stream named ``wall``): the node's AC power; what it has
  beyond the parts is *unmeasured* (power-supply loss, fans, disks, network, the rest).

Streams sent by ``wattlab agent`` carry their host, so a run with agents is a job: each
node's parts, its share of the job's measured energy, and the job total.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from wattlab.analysis.alignment import json_safe, parse_spec, power_channel
from wattlab.analysis.energy.counter_plausibility import counter_checks, describe
from wattlab.analysis.energy.source_energy import energy_report
from wattlab.analysis.energy.validity import invalid_reasons
from wattlab.errors import UsageError
from wattlab.runfile import Run, SourceView

GPU_KINDS = ("nvml", "amdsmi")
LOCAL = "this host"


@dataclass
class Part:
    """One measured part of a node over the run: where its energy comes from, and how."""

    node: str
    part: str  # "gpu0", "cpu", "dram", "module0", "wall", "unmeasured"
    energy_j: float | None
    uncertainty_j: float | None
    streams: list[str]
    how: str
    added: bool = True  # counted in the node's measured total
    valid: bool | None = None  # every figure it takes is valid (docs/validity.md)
    invalid: list[str] = field(default_factory=list)  # "stream: check: reason" per failure


@dataclass
class NodeTotals:
    """A node's parts; its measured total adds only the parts marked ``added``."""

    node: str
    parts: list[Part] = field(default_factory=list)

    def measured(self) -> tuple[float, float]:
        got = [p for p in self.parts if p.added and p.energy_j is not None]
        return (sum(p.energy_j or 0.0 for p in got),
                math.sqrt(sum((p.uncertainty_j or 0.0) ** 2 for p in got)))

    def invalid_parts(self) -> list[str]:
        """The added parts whose figure is invalid: the measured total is invalid with them."""
        return [p.part for p in self.parts if p.added and not p.valid]


def verdict(rows: list[dict[str, Any]]) -> tuple[bool, list[str]]:
    """(valid, reasons) of a part from the energy rows it takes."""
    reasons = [f"{r['source']}:{r['channel']}: {why}" for r in rows
               for why in invalid_reasons(r)]
    return bool(rows) and all(r["valid"] for r in rows), reasons


def node_of(view: SourceView) -> str:
    return view.remote_host or LOCAL


def _on_node(spec: str, view: SourceView) -> str:
    """A stream named in a reader's descriptor, as the run file names it.

    An agent's reader names its own streams (``gpu0.energy``); the recorder files them under
    the agent's name (``node1.gpu0.energy``): read unprefixed, a remote GPU's energy would
    be the local GPU's.
    """
    host = view.remote_host
    if host and view.source_id.startswith(f"{host}.") and not spec.startswith(f"{host}."):
        return f"{host}.{spec}"
    return spec


def _sum(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    if not rows or any(r["energy_j"] is None for r in rows):
        return None, None
    return (sum(r["energy_j"] for r in rows),
            math.sqrt(sum((r["uncertainty_j"] or 0.0) ** 2 for r in rows)))


def _gpu_parts(run: Run, rows: dict[tuple[str, str], dict[str, Any]],
               notes: list[str]) -> Iterable[Part]:
    """One part per GPU (by UUID): the stream its reader named as its energy source.

    Where the reader asked for it (AMD), the counter is checked against the GPU's own
    integrated power, and a disagreement is a note.
    """
    checks = counter_checks(run, rows)
    gpus: dict[str, list[SourceView]] = {}
    for view in run.sources.values():
        if view.kind in GPU_KINDS:
            config = view.descriptor.get("config", {})
            uuid = str(config.get("uuid") or view.descriptor.get("serial") or view.source_id)
            gpus.setdefault(uuid, []).append(view)
    for uuid, views in gpus.items():
        nodes = sorted({node_of(v) for v in views})
        if len(nodes) > 1:
            notes.append(f"GPU {uuid} was recorded from {', '.join(nodes)}: counted once, "
                         f"for {nodes[0]}")
        config = views[0].descriptor.get("config", {})
        index = config.get("gpu_index", len(notes))
        how = str(config.get("energy_source") or "")
        method, _, rest = how.partition(": ")
        spec = rest.split(" ", 1)[0].rstrip(",")
        candidates = [_on_node(spec, views[0])] if method in ("counter", "integrated") else []
        if not how:  # a file from before energy_source: the counter, else samples, else power
            candidates = [f"{v.source_id}:{ch}" for v in views
                          for ch in ("energy_j", "power_w", "average_power_w")
                          if ch in v.channel_names]
        scope = config.get("scope", {})
        covers = scope.get("covers", ["gpu"])
        row = next((rows[k] for c in candidates if (k := parse_spec(c)) in rows), None)
        prefix = "amd" if views[0].kind == "amdsmi" else "gpu"
        part = f"module{index}" if "cpu" in covers else f"{prefix}{index}"
        implausible = [c for v in views if (c := checks.get(v.source_id)) is not None
                       and not c["plausible"] and row is not None
                       and row["source"] == v.source_id]
        if implausible:
            notes.append(describe(f"{nodes[0]} {part}", implausible[0]))
        yield Part(nodes[0], part, None if row is None else row["energy_j"],
                   None if row is None else row["uncertainty_j"],
                   [] if row is None else [f"{row['source']}:{row['channel']}"],
                   (method + rest[len(spec):] if candidates and how else
                    how or "counter, else integrated power (file predates energy_source)")
                   + (f"; {scope['measures']}" if scope.get("measures") else ""),
                   row is not None and row["energy_j"] is not None,
                   *verdict([] if row is None else [row]))


def _rapl_parts(run: Run, rows: dict[tuple[str, str], dict[str, Any]]) -> Iterable[Part]:
    """CPU and DRAM per node from the RAPL package and dram zones; parts of them left out."""
    by_node: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for view in run.sources.values():
        if view.kind != "rapl":
            continue
        for channel, zone in view.descriptor.get("config", {}).get("zones", {}).items():
            row = rows.get((view.source_id, channel))
            if row is None or zone.get("part_of"):
                continue
            part = {"package": "cpu", "dram": "dram"}.get(zone.get("domain"), "psys")
            by_node.setdefault((node_of(view), part), []).append(row)
    for (node, part), got in by_node.items():
        energy_j, unc_j = _sum(got)
        yield Part(node, part, energy_j, unc_j, [f"{r['source']}:{r['channel']}" for r in got],
                   "RAPL counters" if part != "psys" else
                   "RAPL psys: the platform as the SoC sees it, covering the packages: "
                   "listed, not added", part != "psys" and energy_j is not None, *verdict(got))


def _wall_views(run: Run, wall: str | None) -> list[tuple[SourceView, str]]:
    if wall is not None:
        src, ch = parse_spec(wall)
        view = run.source(src)
        channel = ch or power_channel(view)
        if channel is None:
            raise UsageError(f"--wall {wall}: {src} has no power channel; name one")
        return [(view, channel)]
    out = []
    for view in run.sources.values():
        leaf = view.source_id.rsplit(".", 1)[-1]
        if leaf == "wall" and (channel := power_channel(view)) is not None:
            out.append((view, channel))
    return out


def node_report(run: Run, wall: str | None = None) -> dict[str, Any]:
    """Each node's GPU, CPU, DRAM, module and wall energy over the run, and the job total."""
    report = energy_report(run, by_marker=False)
    rows = {(r["source"], r["channel"]): r for r in report["rows"] if r["phase"] == "run"}
    notes: list[str] = []
    parts = list(_gpu_parts(run, rows, notes)) + list(_rapl_parts(run, rows))
    nodes: dict[str, NodeTotals] = {}
    for p in parts:
        nodes.setdefault(p.node, NodeTotals(p.node)).parts.append(p)
    for node in nodes.values():
        modules = [p for p in node.parts if p.part.startswith("module")]
        for p in node.parts:
            if modules and p.part in ("cpu", "dram") and p.added:
                p.added = False
                p.how += f"; not added: {modules[0].part}'s readings already cover the CPU"
        for p in node.parts:
            if not p.added and p.energy_j is None and p.part.startswith(("gpu", "module")):
                notes.append(f"{node.node} {p.part}: no energy (not 0 J): {p.how}")
    for view, channel in _wall_views(run, wall):
        node = nodes.setdefault(node_of(view), NodeTotals(node_of(view)))
        row = rows.get((view.source_id, channel))
        node.parts.append(Part(node.node, "wall", None if row is None else row["energy_j"],
                               None if row is None else row["uncertainty_j"],
                               [f"{view.source_id}:{channel}"], "AC power at the socket",
                               False, *verdict([] if row is None else [row])))
    job_j = sum(n.measured()[0] for n in nodes.values())
    out_nodes = []
    for node in nodes.values():
        measured_j, measured_unc_j = node.measured()
        walls = [p for p in node.parts if p.part == "wall" and p.energy_j is not None]
        invalid = node.invalid_parts()
        unmeasured = None
        if walls:
            unmeasured = {"energy_j": (walls[0].energy_j or 0.0) - measured_j,
                          "uncertainty_j": math.hypot(walls[0].uncertainty_j or 0.0,
                                                      measured_unc_j),
                          "how": "wall minus the measured parts: power-supply loss, fans, "
                                 "disks, network and whatever else no stream measures",
                          "valid": bool(walls[0].valid) and not invalid}
        out_nodes.append({
            "node": node.node, "parts": [vars(p) for p in node.parts],
            "measured_j": measured_j, "measured_uncertainty_j": measured_unc_j,
            "measured_valid": not invalid, "invalid_parts": invalid,
            "share_pct": 100 * measured_j / job_j if job_j else None,
            "unmeasured": unmeasured,
            "missing": [] if walls else ["wall: no wall meter, so what the parts leave out "
                                         "is unknown (--wall SRC names one)"]})
    # every figure the split reports: each node's total, each wall and what it leaves out
    valid = all(not n.invalid_parts() and all(p.valid for p in n.parts if p.part == "wall")
                for n in nodes.values())
    return json_safe({"path": run.path, "span_s": [report["phases"][0]["t0_s"],
                                                   report["phases"][0]["t1_s"]],
                      "nodes": out_nodes, "job_measured_j": job_j,
                      "job_valid": not any(n.invalid_parts() for n in nodes.values()),
                      "valid": valid, "notes": notes})


def format_node_report(report: dict[str, Any]) -> str:
    """One block per node (part, energy, ±, mean W, how), then the job total."""
    t0_s, t1_s = report["span_s"]
    seconds = t1_s - t0_s
    head = f"{'node':<14} {'part':<11} {'energy J':>12} {'± J':>9} {'mean W':>9}  how"
    lines = [f"node energy  ({t0_s:.3f} .. {t1_s:.3f} s, {seconds:.3f} s)", head,
             "-" * len(head)]

    def line(node: str, part: str, energy_j: Any, unc_j: Any, how: str) -> str:
        e = f"{energy_j:12.2f}" if energy_j is not None else f"{'-':>12}"
        u = f"{unc_j:9.2f}" if unc_j is not None else f"{'-':>9}"
        w = f"{energy_j / seconds:9.2f}" if energy_j is not None and seconds > 0 else \
            f"{'-':>9}"
        return f"{node:<14} {part:<11} {e} {u} {w}  {how}"

    def part_line(node: str, p: dict[str, Any]) -> str:
        added = "" if p["added"] or p["part"] == "wall" else " [not added]"
        invalid = "" if p["valid"] or p["energy_j"] is None else \
            f" [INVALID: {'; '.join(p['invalid'])}]"
        return line(node, p["part"], p["energy_j"], p["uncertainty_j"],
                    f"{', '.join(p['streams']) or '-'}: {p['how']}{added}{invalid}")

    for n in report["nodes"]:
        lines += [part_line(n["node"], p) for p in n["parts"] if p["part"] != "wall"]
        share = n["share_pct"]
        lines.append(line(n["node"], "measured", n["measured_j"], n["measured_uncertainty_j"],
                          "sum of the parts above" + (f", {share:.1f} % of the job"
                                                      if share is not None else "")
                          + (f" [INVALID: sums invalid {', '.join(n['invalid_parts'])}]"
                             if n["invalid_parts"] else "")))
        lines += [part_line(n["node"], p) for p in n["parts"] if p["part"] == "wall"]
        if n["unmeasured"] is not None:
            u = n["unmeasured"]
            lines.append(line(n["node"], "unmeasured", u["energy_j"], u["uncertainty_j"],
                              u["how"] + ("" if u["valid"] else " [INVALID: a figure it "
                                                                "subtracts is invalid]")))
        lines += [f"{n['node']:<14} {'missing':<11} {m}" for m in n["missing"]]
    if len(report["nodes"]) > 1:
        lines.append(line("job", "measured", report["job_measured_j"], None,
                          f"{len(report['nodes'])} nodes"
                          + ("" if report["job_valid"] else " [INVALID: a node's is]")))
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
