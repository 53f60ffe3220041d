"""Who pays the shared parts when they are charged (``--charge static,idle``, for chargeback).

Each moment a process holds a context it shares that moment with the others present, in
equal parts: a process's share is its seconds on the GPU, each divided by the number of
processes present then, over the seconds some process was present. Static (what live
contexts cost) and idle (the GPU kept ready) are charged by these shares; the shares sum
to 1 where any process was present, so no joule is charged twice.
"""

from __future__ import annotations

import numpy as np

from wattlab.analysis.attribution.core import Activity, piece_range, pieces, running
from wattlab.analysis.attribution.process_table import ProcessTable


def charge_shares(table: ProcessTable, span_s: tuple[float, float]) -> dict[str, float]:
    """Each process's share of the time processes held the GPU within ``span_s``."""
    acts = [Activity(p.key, "present", *p.present_s) for p in table.processes]
    if not acts:
        return {}
    edges = pieces(acts, *span_s)
    count = running(edges, acts, np.ones(len(acts)))
    dt = np.diff(edges)
    per_one = np.concatenate(([0.0], np.cumsum(np.where(count > 0.5, dt / np.maximum(count, 1),
                                                         0.0))))
    held = float(dt[count > 0.5].sum())
    if held <= 0:
        return {}
    i0, i1 = piece_range(edges, acts)
    out: dict[str, float] = {}
    for a, lo, hi in zip(acts, i0, i1, strict=True):
        out[a.owner] = out.get(a.owner, 0.0) + float(per_one[hi] - per_one[lo]) / held
    return out
