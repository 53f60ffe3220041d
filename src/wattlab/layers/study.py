"""Per-layer results of a model: counts, roofline class, measured energy, clock plans.

Why one place: the CLI, the benchmarks and the report read the same JSON record, built
here from the pieces (counting, roofline, measure, plan).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from wattlab.hardware.simulated_layer_gpu import LayerPhysics, SimulatedLayerGpu
from wattlab.layers.counting import LayerCount, LayerRow
from wattlab.layers.measure import Backend, Measured, measure
from wattlab.layers.plan import Surface, best_within, evaluate, heuristic
from wattlab.layers.plan_hooks import traced_step
from wattlab.layers.roofline import Roofline
from wattlab.layers.sim_backend import SimBackend

SLOWDOWNS = (0.0, 0.02, 0.05, 0.10, 0.20)
SCOPES = {"forward": ("forward",), "training step": ("forward", "backward")}


def count_record(count: LayerCount, roofline: Roofline) -> dict[str, Any]:
    """The counts as JSON rows, each with its roofline class."""
    rows = [{**r.to_json(), "bound": roofline.bound(r.intensity)} for r in count.rows]
    return {"input": list(count.input_shape), "dtype": count.dtype, "train": count.train,
            "roofline": roofline.to_json(), "total_flops": count.total_flops,
            "total_macs": count.total_macs, "other_flops": count.other_flops, "rows": rows}


def time_groups(times_s: Sequence[float], n_groups: int) -> list[list[int]]:
    """Consecutive indices cut into at most ``n_groups`` runs of about equal time."""
    total = float(sum(times_s))
    groups: list[list[int]] = [[]]
    done = 0.0
    for i, t in enumerate(times_s):
        if groups[-1] and done >= total * len(groups) / n_groups:
            groups.append([])
        groups[-1].append(i)
        done += t
    return groups


def measure_rows(backend: Backend, jobs: Sequence[Any], combine: Callable[[list[Any]], Any],
                 *, n_groups: int, min_window_s: float,
                 progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Time and energy per row (one pass), measured in groups of consecutive rows.

    Each row's time is its own (GPU timer, 1 s of runs at most); a group's energy, measured
    in a window of ``min_window_s``, is split over its rows by their times (the group's
    power is taken as each row's), so a one-row group is the row's own measurement.
    """
    times = []
    for job in jobs:
        n = max(3, min(1000, round(0.05 / max(backend.time_s(job, 1), 1e-7))))
        times.append(backend.time_s(job, n) / n)
    out: list[dict[str, Any]] = [{} for _ in jobs]
    for k, group in enumerate(time_groups(times, n_groups)):
        m = measure(backend, combine([jobs[i] for i in group]), min_window_s)
        share = sum(times[i] for i in group)
        rel = m.energy_se_j / m.energy_j
        for i in group:
            e = m.energy_j * times[i] / share
            out[i] = {"time_s": times[i], "energy_j": e, "energy_se_j": e * rel,
                      "power_w": m.power_w, "group": k, "group_size": len(group)}
        if progress:
            progress(f"group {k}: {len(group)} layer(s), {m.time_s * 1e3:.3f} ms, "
                     f"{m.energy_j:.4g} ± {m.energy_se_j:.2g} J")
    return out


def sum_check(rows: Sequence[dict[str, Any]], whole: Measured) -> dict[str, Any]:
    """The layers' sums against the whole pass measured directly."""
    t = sum(r["time_s"] for r in rows)
    e = sum(r["energy_j"] for r in rows)
    e_se = math.sqrt(sum(r["energy_se_j"] ** 2 for r in rows))
    return {"layers_time_s": t, "layers_energy_j": e, "layers_energy_se_j": e_se,
            "whole": whole.to_json(), "time_error": t / whole.time_s - 1,
            "energy_error": e / whole.energy_j - 1}


def measure_record(record: dict[str, Any], count: LayerCount, backend: Backend, *,
                   jobs_of: Callable[[Sequence[LayerRow]], list[Any]],
                   combine: Callable[[list[Any]], Any], whole_job: Any, n_groups: int,
                   window_s: float, progress: Callable[[str], None] | None = None
                   ) -> dict[str, Any]:
    """Measure every row (adds ``measured`` to the record's rows) and the whole pass."""
    by_key = {f"{r['name'] or '(model)'}:{r['pass_name']}": r for r in record["rows"]}
    measured = []
    for pass_name in ("forward", "backward") if count.train else ("forward",):
        rows = count.of_pass(pass_name)
        if progress:
            progress(f"{pass_name}: {len(rows)} layers")
        results = measure_rows(backend, jobs_of(rows), combine, n_groups=n_groups,
                               min_window_s=window_s, progress=progress)
        for row, res in zip(rows, results, strict=True):
            by_key[row.key]["measured"] = res
        measured += results
    whole = measure(backend, whole_job, window_s)
    return {"training step" if count.train else "forward": sum_check(measured, whole)}


def joined(jobs: list[list[tuple[str, float, float]]]) -> list[tuple[str, float, float]]:
    """Simulated jobs run one after the other: their operations in order."""
    return [op for job in jobs for op in job]


def sim_jobs(rows: Sequence[LayerRow]) -> list[list[tuple[str, float, float]]]:
    return [[("run", float(r.work_flops), float(r.bytes_total))] for r in rows]


def surface_of(physics: LayerPhysics, rows: Sequence[LayerRow]) -> Surface:
    """The simulator's time and energy of every row at every supported clock pair."""
    sm, mem = physics.pairs()
    work = np.array([r.work_flops for r in rows], float)[:, None]
    moved = np.array([r.bytes_total for r in rows], float)[:, None]
    t, p = physics.cost(work, moved, sm[None, :], mem[None, :])
    default = int(np.flatnonzero((sm == physics.default_pair[0])
                                 & (mem == physics.default_pair[1]))[0])
    sw_t, sw_e = physics.switch_cost()
    return Surface(t, t * p, sm, mem, default, sw_t, sw_e)


def plan_record(physics: LayerPhysics, count: LayerCount,
                slowdowns: Sequence[float] = SLOWDOWNS) -> dict[str, Any]:
    """Exhaustive and heuristic plans per scope and slowdown bound, against the default."""
    out: dict[str, Any] = {"switch_s": physics.switch_s, "pairs": len(physics.pairs()[0]),
                           "scopes": {}}
    for scope, passes in SCOPES.items():
        rows = [r for r in count.rows if r.pass_name in passes]
        if not count.train and scope != "forward":
            continue
        surface = surface_of(physics, rows)
        base = evaluate(surface, np.full(len(rows), surface.default), "default")
        work = np.array([r.work_flops for r in rows], float)
        moved = np.array([r.bytes_total for r in rows], float)
        entries = []
        for s in slowdowns:
            best = best_within(surface, s)
            rule = heuristic(surface, work, moved, physics.roofline, s)
            entries.append({"max_slowdown": s, "exhaustive": best.to_json(surface, base),
                            "heuristic": rule.to_json(surface, base)})
        out["scopes"][scope] = {"keys": [r.key for r in rows],
                                "default": base.to_json(surface, base), "plans": entries}
    return out


def execute_plan(model: Any, count: LayerCount, physics: LayerPhysics, plan: dict[str, Any],
                 *, keys: Sequence[str], seed: int = 0, min_window_s: float = 1.0) -> Measured:
    """Run one pass with the plan's clocks on the simulated GPU (hooks) and measure it."""
    pairs = {k: (sm, mem) for k, sm, mem in zip(keys, plan["sm_mhz"], plan["mem_mhz"],
                                                strict=True)}
    ops = traced_step(model, count, pairs, physics.default_pair)
    return measure(SimBackend(SimulatedLayerGpu(physics, seed)), ops, min_window_s)

