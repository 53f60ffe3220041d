"""The report's per-process table: `wattlab energy --by-process` on the page.

Why separate from html_report.py: the page builder only places it (after the energy
panel); what it says is the split's own (analysis/attribution/by_process.py). A run
without a per-process stream gets no table; where the driver refused the query, the
reason is shown instead of a figure.
"""

from __future__ import annotations

import html

from wattlab.analysis.attribution import ByProcess, energy_by_process
from wattlab.errors import UsageError
from wattlab.runfile import Run


def process_sections(run: Run) -> list[tuple[str, str]]:
    """[("energy", HTML)] with one table per GPU, or [] where the run has no per-process data."""
    try:
        result = energy_by_process(run)
    except UsageError as e:
        return [("energy", f"<p>Energy per process: none ({html.escape(str(e))})</p>")]
    if not result.gpus and not any("refused" in m for m in result.missing):
        return []
    return [("energy", _tables(result))]


def _tables(result: ByProcess) -> str:
    e = html.escape
    out = ["<h3>Energy per process (activity rule; docs/process-energy.md)</h3>"]
    out += [f"<p>No per-process figure for {e(m)}</p>" for m in result.missing]
    for g in result.gpus:
        b = g.baseline
        out.append(f"<p>gpu{g.gpu}: {g.total_j:.1f} J ({e(g.total_how)}) = processes "
                   f"{sum(p.energy_j for p in g.processes):.1f} J + static {g.static_j:.1f} J "
                   f"+ idle {g.idle_j:.1f} J + no process active {g.unattributed_j:.1f} J. "
                   f"Idle {b.idle_w:.1f} ± {b.idle_pm_w:.1f} W ({e(b.idle_how)}); static "
                   f"{b.static_w:.1f} ± {b.static_pm_w:.1f} W ({e(b.static_how)}).</p>")
        out += [f"<p>! {e(c)}</p>" for c in g.rule.caveats]
        rows = "".join(
            f"<tr><td class='l'>{e(p.label)}</td><td>{p.present_s[0]:.2f}–{p.present_s[1]:.2f}"
            f"</td><td>{p.dynamic_j:.1f}</td><td>{p.energy_j:.1f} ± {p.pm_j:.1f}</td>"
            f"<td>{p.rule_pm_j:.1f}</td><td>{'yes' if p.valid else 'NO'}</td></tr>"
            for p in sorted(g.processes, key=lambda p: -p.energy_j))
        out.append("<table><tr><th class='l'>process</th><th>present (s)</th><th>dynamic (J)"
                   "</th><th>energy (J)</th><th>rule ± (J)</th><th>valid</th></tr>"
                   f"{rows}</table>")
    return "".join(out)
