"""The report's view of a ``wattlab tune`` run: the search as a figure and a table.

Why separate from html_report.py: it only draws the tuning record (what the tuner wrote, read by
runfile/tuning_record.py); the page builder adds the panel when a run has one.
"""

from __future__ import annotations

import html
import json

import numpy as np

from wattlab.analysis.report import plots
from wattlab.runfile import read_tuning


def tuning_panel(path: str) -> tuple[object, str, str] | None:
    """(figure, caption, HTML table of probes) or None when the run was not tuned."""
    record = read_tuning(path)
    if record is None:
        return None
    it = record.iterations
    knobs, p, setting = record.knobs, record.probes, record.probes.settings
    labels = [" ".join(f"{setting[k][j]:g}" for k in knobs) + f" ({p.purpose[j]})"
              for j in range(len(p.purpose))]
    fig = plots.tuning_figure(np.asarray(it.start_ns, dtype=np.int64) / 1e9,
                              np.asarray(it.energy_j, dtype=np.float64),
                              np.asarray(it.probe, dtype=np.int64),
                              np.asarray(it.used, dtype=bool), labels)
    s = record.summary
    base_e, base_t = p.energy_j[0], p.time_s[0]
    rows = "".join(
        f"<tr><td class='l'>{j}</td><td class='l'>{html.escape(str(p.purpose[j]))}</td>"
        + "".join(f"<td>{setting[k][j]:g}</td>" for k in knobs)
        + f"<td>{p.iterations[j]}</td><td>{p.energy_j[j]:.4g} ± {p.energy_se_j[j]:.2g}"
          f"</td><td>{p.time_s[j] * 1e3:.2f} ± {p.time_se_s[j] * 1e3:.2g}</td>"
          f"<td>{p.energy_j[j] / base_e - 1:+.1%}</td><td>{p.time_s[j] / base_t - 1:+.1%}"
          "</td></tr>" for j in range(len(p.purpose)))
    head = ("<tr><th class='l'>#</th><th class='l'>why</th>"
            + "".join(f"<th>{html.escape(k)}</th>" for k in knobs)
            + "<th>iterations</th><th>energy (J)</th><th>time (ms)</th><th>energy vs "
              "default</th><th>time vs default</th></tr>")
    verdict = ("dry run: nothing changed" if s["dry_run"] else
               f"kept {html.escape(json.dumps(s['chosen']))}")
    trials = "".join(  # challengers run in the kept setting's place (docs/tune.md, 7.)
        f"<li>{html.escape(json.dumps(t['setting']))}: iterations {t['start']}-"
        f"{t['end'] if t['end'] is not None else 'end'}, {html.escape(t['outcome'])}</li>"
        for t in s.get("trials", []))
    table = (f"<h3>Tuning ({html.escape(s['objective'])}, max slowdown "
             f"{s['max_slowdown']:.1%}, iterations from "
             f"{html.escape(s['iteration_source'])})</h3><p>{verdict}; "
             f"{len(record.models)} model fits</p>"
             + (f"<p>Trials:</p><ul>{trials}</ul>" if trials else "")
             + f"<table>{head}{rows}</table>")
    caption = ("Energy of every iteration the tuner detected, coloured by the setting in "
               "force (hollow: not counted). The table lists each setting measured: mean and "
               "standard error per iteration, against the default.")
    return fig, caption, table
