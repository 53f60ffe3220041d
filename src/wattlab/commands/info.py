"""`wattlab info RUN [--json]`: what a run file holds."""

from __future__ import annotations

import argparse
import io
import json
from contextlib import redirect_stdout
from typing import Any

from wattlab.analysis.energy import format_table, summarise
from wattlab.analysis.many_runs import add_runs_arguments, expand_runs, map_runs, report_errors
from wattlab.runfile import MarkerRow, Run, schema, show_recording_cpu, writer_status


def describe(run: Run) -> dict[str, Any]:
    """The JSON shape of `wattlab info --json`."""
    attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in run.attrs.items()}
    status = writer_status(run.path)
    return {
        "path": run.path,
        "open_for_writing": status.open,
        "writer_alive": status.alive,
        "needs_repair": status.needs_repair,
        "attrs": attrs,
        "sources": {
            sid: {
                "kind": view.kind,
                "model": view.model,
                "rows": len(view),
                "channels": [
                    {"name": n, "unit": u}
                    for n, u in zip(view.channel_names, view.units, strict=True)
                ],
                "descriptor": view.descriptor,
            }
            for sid, view in run.sources.items()
        },
        "summary": [s.to_json() for s in summarise(run)],
        "markers": len(run.markers),
        "markers_with_gpu_time": sum(m.gpu_time_ns is not None for m in run.markers),
        "gaps": [g.__dict__ for g in run.gaps],
    }


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser("info", help="describe a run file")
    add_runs_arguments(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def run(args: argparse.Namespace) -> int:
    paths = expand_runs(args.runs)
    if len(paths) == 1:
        return show(paths[0], args.json)
    outcomes = list(map_runs(described if args.json else shown, paths, args.jobs))
    if args.json:
        print(json.dumps([o.result for o in outcomes if not o.error], indent=2, default=str))
    else:
        print("\n".join(f"== {o.path}\n{o.result}" for o in outcomes if not o.error))
    return report_errors(outcomes)


def described(path: str) -> dict[str, Any]:
    """``info --json`` of one file (a worker's job)."""
    with Run(path) as run_file:
        return describe(run_file)


def shown(path: str) -> str:
    """``info``'s text for one file (a worker's job)."""
    with redirect_stdout(io.StringIO()) as text:
        show(path, False)
    return text.getvalue().rstrip("\n")


def show(path: str, as_json: bool) -> int:
    """Print what one run file holds."""
    with Run(path) as run_file:
        if as_json:
            print(json.dumps(describe(run_file), indent=2, default=str))
            return 0
        attrs = run_file.attrs
        print(f"{run_file.path}: wattlab run format {attrs.get(schema.FORMAT_VERSION_ATTR)}, "
              f"created {attrs.get(schema.CREATED, '?')} on {attrs.get(schema.HOST, '?')}")
        print(f"command: {' '.join(json.loads(attrs.get(schema.COMMAND, '[]'))) or '-'}")
        show_recording_cpu(attrs)
        status = writer_status(run_file.path)
        if status.open:
            print(("needs repair: " if status.needs_repair else "") + status.describe(
                run_file.path))
        if schema.REPAIR_JSON in attrs:
            record = json.loads(attrs[schema.REPAIR_JSON])
            print(f"repaired {record['repaired_at']} after a crash: "
                  f"{sum(s['rows_trimmed'] for s in record['sources'].values())} torn row(s) "
                  "trimmed, every whole row kept")
        for sid, view in run_file.sources.items():
            channels = ", ".join(f"{n} [{u}]" for n, u in zip(view.channel_names, view.units,
                                                               strict=True))
            print(f"  {sid}: {view.kind} {view.model} - {channels}")
        print(format_table(summarise(run_file)))
        markers = run_file.markers
        print(f"markers: {len(markers)}{_gpu_note(markers)}; gaps: {len(run_file.gaps)}")
        for gap in run_file.gaps:
            print(f"  gap {gap.source}: seq {gap.seq_first}..{gap.seq_last} {gap.reason}")
    return 0


def _gpu_note(markers: list[MarkerRow]) -> str:
    """How many markers carry the GPU's time, and how well their clock pairing knew it."""
    unc = sorted(m.gpu_uncertainty_ns for m in markers if m.gpu_uncertainty_ns is not None)
    if not unc:
        return ""
    return (f" ({len(unc)} on the GPU's time, pairing ± {unc[len(unc) // 2] / 1e3:.0f} µs "
            "median)")
