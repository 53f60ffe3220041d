"""The report's view of ``/analysis/layers``: per-layer time, energy, intensity, clocks.

Why separate from html_report.py: it only reads what `wattlab layers --store` wrote and draws it.
"""

from __future__ import annotations

import html

import numpy as np

from wattlab.analysis.report import plots
from wattlab.runfile import LayersRecord, read_layers


def _plan_sm(record: LayersRecord, keys: list[str]) -> np.ndarray | None:
    """SM clock per row of the exhaustive plan at the largest slowdown, where there is one."""
    scopes = record.plans.scopes if record.plans else {}
    block = scopes.get("training step") or scopes.get("forward")
    if block is None:
        return None
    plan = block.plans[-1].exhaustive
    by_key = dict(zip(block.keys, plan.sm_mhz, strict=True))
    return np.array([by_key.get(k, np.nan) for k in keys], dtype=float)


def layers_panel(path: str) -> tuple[object, str, str] | None:
    """(figure, caption, HTML summary) or None when the run has no layer record."""
    record = read_layers(path)
    if record is None:
        return None
    rows = record.rows
    keys = [r.key for r in rows]
    labels = [f"{r.name or '(model)'} {'F' if r.pass_name == 'forward' else 'B'}"
              for r in rows]
    measured = [r.measured for r in rows]
    time_s = np.array([np.nan if m is None else m.time_s for m in measured], dtype=float)
    energy_j = np.array([np.nan if m is None else m.energy_j for m in measured], dtype=float)
    energy_se_j = np.array([np.nan if m is None else m.energy_se_j for m in measured],
                           dtype=float)
    intensity = np.array([r.intensity or np.nan for r in rows], dtype=float)
    fig = plots.layers_figure(labels, time_s, energy_j, energy_se_j, intensity=intensity,
                              ridge=record.roofline.ridge_flop_per_byte,
                              sm_mhz=_plan_sm(record, keys))
    lines = [f"{html.escape(record.model)}: {record.total_macs / 1e9:.4g} GMACs, "
             f"{len(rows)} layer rows on {html.escape(record.device)}"]
    for scope, c in (record.checks or {}).items():
        lines.append(f"{html.escape(scope)}: layers sum {c.layers_energy_j:.4g} ± "
                     f"{c.layers_energy_se_j:.2g} J vs whole {c.whole.energy_j:.4g} J "
                     f"({c.energy_error:+.1%}); time {c.time_error:+.1%}")
    for scope, block in (record.plans.scopes if record.plans else {}).items():
        for e in block.plans:
            lines.append(f"plan, {html.escape(scope)}, max slowdown {e.max_slowdown:.0%}: "
                         f"exhaustive {e.exhaustive.energy_saving:+.1%} energy saved at "
                         f"{e.exhaustive.slowdown:+.1%} time; heuristic "
                         f"{e.heuristic.energy_saving:+.1%}")
    caption = ("Per layer in execution order (F forward, B backward): time and energy measured "
               "(error bars: one standard error), arithmetic intensity against the "
               "roofline's ridge (red: compute-bound), and the SM clock of the exhaustive plan "
               "at the largest slowdown searched.")
    return fig, caption, "<h3>Layers</h3><p>" + "<br>".join(lines) + "</p>"
