"""The next probe along one knob while the search explores: spread, modelled or local.

Why a module of its own: the coordinate search (search.py) walks each knob's line of
settings (the other knobs at their best so far); these choose the next setting on that
line from what is measured: two spread probes first, then the model's best predicted
setting, then an unmeasured neighbour of the best measured one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from wattlab.analysis.models import (
    CURVE_FITS,
    PER_WORKLOAD,
    SweepTable,
    choose_family,
    loo_predictions,
    score_families,
)
from wattlab.errors import UsageError

if TYPE_CHECKING:
    from wattlab.tuning.search import Index, Probe
    from wattlab.tuning.standings import Standings

SPREAD = (0.3, 0.65)  # first probes along a knob, as fractions of its range from the bottom


def spread_pick(line: list[Index], probes: Mapping[Index, Probe]) -> tuple[Index, str] | None:
    """The first unmeasured of the spread probes along the line."""
    n = len(line)
    for frac in SPREAD:
        idx = line[min(n - 1, round(frac * (n - 1)))]
        if idx not in probes:
            return idx, "spread"
    return None


def local_pick(line: list[Index], best: Index, probes: Mapping[Index, Probe]
               ) -> tuple[Index, str] | None:
    """An unmeasured neighbour of the best measured setting on the line."""
    pos = line.index(best) if best in line else None
    if pos is None:
        return None
    for j in (pos - 1, pos + 1):
        if 0 <= j < len(line) and line[j] not in probes:
            return line[j], "local"
    return None


def model_candidates(st: Standings, line: list[Index], k: int, knob: str,
                     values: tuple[float, ...]) -> tuple[list[Index], dict[str, Any]] | None:
    """Settings on the line the model cannot tell from its best, best predicted first.

    ``k``: the line's knob (``knob``, whose settings are ``values``). Also returns what
    the model was (family, points, held-out errors); None where no model can be made.
    """
    measured = [i for i in line if i in st.probes and len(st.probes[i].energy_j) > 1]
    if len(measured) < 3:
        return None
    x = np.array([values[i[k]] for i in measured])
    stats = [st.probes[i].stats() for i in measured]
    t = np.array([s[2] for s in stats])
    e = np.array([s[0] for s in stats])
    table = SweepTable(knob, ["run"] * len(measured), x, t, e)
    families = tuple(f for f in PER_WORKLOAD if f != "spline" or len(measured) >= 5)
    scores = score_families(table, loo_predictions(table, families))
    quantity = "energy" if st.cfg.objective == "energy" else "edp"
    try:
        chosen = choose_family(scores, st.cfg.objective)
    except UsageError:
        return None
    xs = np.array([values[i[k]] for i in line])
    fit = CURVE_FITS[chosen.family]
    t_curve, p_curve = fit(x, t), fit(x, e / t)
    if t_curve is None or p_curve is None:
        return None
    t_hat = np.maximum(t_curve(xs), 1e-9)
    e_hat = t_hat * np.maximum(p_curve(xs), 1e-9)
    obj = e_hat if st.cfg.objective == "energy" else e_hat * t_hat
    # the model's own held-out error says how far to trust it: every setting it cannot
    # tell from the best (within twice that error) is a candidate worth measuring
    err_obj = 2e-2 * chosen.mape_common[quantity]
    err_t = 2e-2 * chosen.mape_common.get("time", 0.0)
    t0 = st.probes[st.default].stats()[2]
    ok = t_hat * (1 - err_t) <= t0 * (1 + st.cfg.max_slowdown)
    best_obj = float(obj[ok].min()) if ok.any() else math.inf
    near = ok & (obj * (1 - err_obj) <= best_obj * (1 + err_obj))
    candidates = [line[j] for j in np.argsort(obj) if near[j]]
    model = {"family": chosen.family, "points": len(measured),
             "loo_mape": {s.family: s.mape_common.get(quantity) for s in scores}}
    return candidates, model
