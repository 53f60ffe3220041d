"""Per-layer results of a model: counts, roofline class, measured energy, clock plans.

Why one place: the CLI, the benchmarks and the report read the same record
(``runfile.LayersRecord``, typed; its JSON is what `wattlab layers` prints and stores),
built here from the pieces (counting, roofline, measure, plan).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from wattlab.device_models import LayerPhysics, Roofline
from wattlab.layers.counting import LayerCount, LayerRow
from wattlab.layers.in_step import BETWEEN, HOST_BOUND, InStep, Mark, summarise
from wattlab.layers.measure import Backend, Measured, measure
from wattlab.layers.plan import Surface, best_within, evaluate, heuristic
from wattlab.layers.plan_hooks import call_key, traced_step, without_marks
from wattlab.runfile import (
    BetweenLayers,
    ClockPlans,
    ClockSource,
    GroupMeasured,
    GroupSumCheck,
    LayersRecord,
    PlanCost,
    RooflineLimits,
    ScopePlans,
    SlowdownPlans,
)

if TYPE_CHECKING:
    from wattlab.layers.sim_backend import SimBackend

SLOWDOWNS = (0.0, 0.02, 0.05, 0.10, 0.20)
WHOLE_WINDOW_S = 3.0  # the whole step's window: its energy to about 1 %
STEPS = 20  # real steps timed with events at every layer boundary
SCOPES = {"forward": ("forward",), "training step": ("forward", "backward")}
SIMULATED_CLOCKS = "simulated H100 list"  # the clock pairs' source on the simulated GPU


def count_record(count: LayerCount, roofline: Roofline, *, device: str,
                 model: str) -> LayersRecord:
    """The counts, each row with its roofline class: the record before any measurement."""
    return LayersRecord(
        input=tuple(count.input_shape), dtype=count.dtype, train=count.train,
        roofline=RooflineLimits(peak_flops=roofline.peak_flops,
                                bandwidth_bps=roofline.bandwidth_bps,
                                ridge_flop_per_byte=roofline.ridge, source=roofline.source),
        total_flops=count.total_flops, total_macs=count.total_macs,
        other_flops=count.other_flops,
        rows=tuple(r.to_record(roofline.bound(r.intensity)) for r in count.rows),
        device=device, model=model)


def time_groups(times_s: Sequence[float], n_groups: int) -> list[list[int]]:
    """Consecutive indices cut into at most ``n_groups`` runs of about equal time."""
    weights = list(times_s) if sum(times_s) > 0 else [1.0] * len(times_s)
    total = float(sum(weights))
    groups: list[list[int]] = [[]]
    done = 0.0
    for i, t in enumerate(weights):
        if groups[-1] and done >= total * len(groups) / n_groups:
            groups.append([])
        groups[-1].append(i)
        done += t
    return groups


def time_alone_s(backend: Backend, job: Any) -> float:
    """GPU time of one run of a layer replayed alone, back to back (up to 50 ms of runs)."""
    n = max(3, min(1000, round(0.05 / max(backend.time_s(job, 1), 1e-7))))
    return backend.time_s(job, n) / n


def measure_rows(backend: Backend, jobs: Sequence[Any], keys: Sequence[str],
                 combine: Callable[[list[Any]], Any], in_step: InStep, *, n_groups: int,
                 min_window_s: float, progress: Callable[[str], None] | None = None
                 ) -> tuple[list[GroupMeasured], list[tuple[float, float]]]:
    """Time and energy per row of one pass: time inside the step, power in isolation.

    Rows are cut into at most ``n_groups`` runs of consecutive rows of about equal in-step
    time; each run is replayed alone for ``min_window_s`` while the energy counter gives
    its power, which is taken as each of its rows' power. A row's energy = that power × the
    row's time inside the step. Also returns each group's (power se W, in-step time s),
    whose errors are shared by the group's rows.
    """
    step_s = [in_step.time_s.get(k, 0.0) for k in keys]
    out: dict[int, GroupMeasured] = {}
    shared: list[tuple[float, float]] = []
    for k, group in enumerate(time_groups(step_s, n_groups)):
        m = measure(backend, combine([jobs[i] for i in group]), min_window_s)
        for i in group:
            t, t_se = step_s[i], in_step.time_se_s.get(keys[i], 0.0)
            out[i] = GroupMeasured(
                time_s=t, time_se_s=t_se, time_alone_s=time_alone_s(backend, jobs[i]),
                power_w=m.power_w, power_se_w=m.power_se_w, energy_j=m.power_w * t,
                energy_se_j=math.hypot(m.power_se_w * t, m.power_w * t_se), group=k,
                group_size=len(group))
        shared.append((m.power_se_w, sum(step_s[i] for i in group)))
        if progress:
            progress(f"group {k}: {len(group)} layer(s), {shared[-1][1] * 1e3:.3f} ms in "
                     f"the step, {m.power_w:.4g} ± {m.power_se_w:.2g} W alone")
    return [out[i] for i in range(len(jobs))], shared


def sum_check(rows: Sequence[GroupMeasured], between: BetweenLayers,
              shared: Sequence[tuple[float, float]], in_step: InStep,
              whole: Measured) -> GroupSumCheck:
    """The rows and ``between layers`` summed, against the whole step measured directly.

    The sum's energy error: each group's power error over its whole in-step time (shared
    by its rows), and the step time's spread over steps at the step's power.
    """
    t = sum(r.time_s for r in rows) + between.time_s
    e = sum(r.energy_j for r in rows) + between.energy_j
    e_se = math.sqrt(sum((p_se * t_g) ** 2 for p_se, t_g in shared)
                     + (between.power_se_w * between.time_s) ** 2
                     + (e / max(t, 1e-12) * in_step.step_se_s) ** 2)
    return GroupSumCheck(
        layers_time_s=t, layers_time_se_s=in_step.step_se_s,
        layers_alone_time_s=sum(r.time_alone_s for r in rows), layers_energy_j=e,
        layers_energy_se_j=e_se, steps=in_step.steps, between=between,
        whole=whole.to_record(), time_error=t / whole.time_s - 1,
        energy_error=e / whole.energy_j - 1, warning=host_bound_warning(t, whole))


def host_bound_warning(hooked_s: float, whole: Measured) -> str | None:
    """Why the in-step times cannot be trusted, when the hooks themselves slowed the step.

    Every layer boundary costs the host an event (tens of µs on a real GPU's host); a step
    of many short layers then waits on the host, and the spans measure the host's pace.
    """
    slower = hooked_s / whole.time_s - 1
    if slower <= HOST_BOUND + 2 * whole.time_se_s / whole.time_s:
        return None
    return (f"the step with an event at every layer boundary took {slower:+.0%} longer than "
            f"without: the host, not the GPU, set its pace, so the in-step times hold host "
            f"waits; use a larger batch (longer layers) or fewer layers")


def measure_record(record: LayersRecord, count: LayerCount, backend: Backend, *,
                   jobs_of: Callable[[Sequence[LayerRow]], list[Any]],
                   combine: Callable[[list[Any]], Any], whole_job: Any,
                   step_marks: Callable[[int], list[Mark]], n_groups: int, window_s: float,
                   whole_window_s: float = WHOLE_WINDOW_S, steps: int = STEPS,
                   progress: Callable[[str], None] | None = None) -> LayersRecord:
    """The record with every row measured and the rows' sum checked against the whole pass.

    ``step_marks(n)``: the layer boundaries' GPU times over ``n`` real steps (in_step.py);
    ``whole_job``: the pass with no hooks, measured for ``whole_window_s``.
    """
    in_step = summarise(step_marks(steps))
    if progress:
        progress(f"in the step: {in_step.step_s * 1e3:.3f} ± {in_step.step_se_s * 1e3:.2g} ms "
                 f"over {in_step.steps} steps")
    by_key: dict[str, GroupMeasured] = {}
    measured: list[GroupMeasured] = []
    shared: list[tuple[float, float]] = []
    for pass_name in ("forward", "backward") if count.train else ("forward",):
        rows = count.of_pass(pass_name)
        if progress:
            progress(f"{pass_name}: {len(rows)} layers")
        results, groups = measure_rows(backend, jobs_of(rows), [r.key for r in rows], combine,
                                       in_step, n_groups=n_groups, min_window_s=window_s,
                                       progress=progress)
        for row, res in zip(rows, results, strict=True):
            by_key[row.key] = res
        measured += results
        shared += groups
    whole = measure(backend, whole_job, whole_window_s)
    t_b, t_b_se = in_step.time_s.get(BETWEEN, 0.0), in_step.time_se_s.get(BETWEEN, 0.0)
    between = BetweenLayers(
        time_s=t_b, time_se_s=t_b_se, power_w=whole.power_w, power_se_w=whole.power_se_w,
        energy_j=whole.power_w * t_b,
        energy_se_j=math.hypot(whole.power_se_w * t_b, whole.power_w * t_b_se),
        note="outside every leaf module (residual additions, the loss, glue); "
             "power: the whole step's")
    scope = "training step" if count.train else "forward"
    return record.measured_as(by_key, {scope: sum_check(measured, between, shared, in_step,
                                                        whole)})


def sim_jobs(rows: Sequence[LayerRow]) -> list[list[tuple[str, float, float]]]:
    return [[("run", float(r.work_flops), float(r.bytes_total))] for r in rows]


def joined(jobs: list[list[tuple[str, float, float]]]) -> list[tuple[str, float, float]]:
    """Simulated jobs run one after the other: their operations in order."""
    return [op for job in jobs for op in job]


def _simulated_backend(physics: LayerPhysics, seed: int) -> SimBackend:
    """The simulated layer GPU as a backend; imported here, on the simulate path only."""
    from wattlab.hardware.simulated_layer_gpu import SimulatedLayerGpu
    from wattlab.layers.sim_backend import SimBackend

    return SimBackend(SimulatedLayerGpu(physics, seed))


def measure_simulated(record: LayersRecord, model: Any, count: LayerCount,
                      physics: LayerPhysics, *, seed: int, n_groups: int, window_s: float,
                      whole_window_s: float = WHOLE_WINDOW_S,
                      progress: Callable[[str], None] | None = None) -> LayersRecord:
    """`measure_record` on the simulated GPU: the traced step with marks, as on a real GPU."""
    backend = _simulated_backend(physics, seed)
    step = traced_step(model, count, {}, physics.default_pair, marks=True)
    return measure_record(record, count, backend, jobs_of=sim_jobs, combine=joined,
                          whole_job=without_marks(step),
                          step_marks=lambda n: backend.step_marks(step, n), n_groups=n_groups,
                          window_s=window_s, whole_window_s=whole_window_s, progress=progress)


def surface_of(physics: LayerPhysics, rows: Sequence[LayerRow] | None = None, *,
               work_flops: Any = None, bytes_moved: Any = None) -> Surface:
    """The simulator's time and energy of every row (or work/bytes pair) at every clock pair."""
    sm, mem = physics.pairs()
    if rows is not None:
        work_flops = [r.work_flops for r in rows]
        bytes_moved = [r.bytes_total for r in rows]
    work = np.asarray(work_flops, float)[:, None]
    moved = np.asarray(bytes_moved, float)[:, None]
    t, p = physics.cost(work, moved, sm[None, :], mem[None, :])
    default = int(np.flatnonzero((sm == physics.default_pair[0])
                                 & (mem == physics.default_pair[1]))[0])
    sw_t, sw_e = physics.switch_cost()
    return Surface(t, t * p, sm, mem, default, sw_t, sw_e)


def plan_rows(count: LayerCount, passes: Sequence[str],
              calls: Sequence[tuple[str, int]] | None) -> tuple[list[str], Any, Any]:
    """(keys, work FLOPs, bytes) of the plan's rows.

    One per module and pass, or with ``calls`` (plan_hooks.call_sequence) one per call in
    execution order, so a module called several times may switch at each call; a call
    gets its module's share.
    """
    rows = {r.key: r for r in count.rows if r.pass_name in passes}
    items: list[tuple[str, float, float]]
    if calls is None:
        items = [(k, float(r.work_flops), float(r.bytes_total)) for k, r in rows.items()]
    else:
        items = [(call_key(k, c), rows[k].work_flops / rows[k].calls,
                  rows[k].bytes_total / rows[k].calls) for k, c in calls if k in rows]
    return ([k for k, _, _ in items], np.array([w for _, w, _ in items], float),
            np.array([b for _, _, b in items], float))


def plan_record(physics: LayerPhysics, count: LayerCount,
                slowdowns: Sequence[float] = SLOWDOWNS, *,
                calls: Sequence[tuple[str, int]] | None = None) -> ClockPlans:
    """Exhaustive and heuristic plans per scope and slowdown bound, against the default.

    ``calls``: rows per call (plan_rows) instead of per module.
    """
    scopes: dict[str, ScopePlans] = {}
    for scope, passes in SCOPES.items():
        if not count.train and scope != "forward":
            continue
        keys, work, moved = plan_rows(count, passes, calls)
        surface = surface_of(physics, work_flops=work, bytes_moved=moved)
        base = evaluate(surface, np.full(len(keys), surface.default), "default")
        entries = []
        for s in slowdowns:
            best = best_within(surface, s)
            rule = heuristic(surface, work, moved, physics.roofline, s)
            entries.append(SlowdownPlans(max_slowdown=s,
                                         exhaustive=best.to_record(surface, base),
                                         heuristic=rule.to_record(surface, base)))
        scopes[scope] = ScopePlans(keys=tuple(keys), default=base.to_record(surface, base),
                                   plans=tuple(entries))
    return ClockPlans(switch_s=physics.switch_s, pairs=len(physics.pairs()[0]),
                      rows="per call" if calls is not None else "per module", scopes=scopes)


def execute_plan(model: Any, count: LayerCount, physics: LayerPhysics, plan: PlanCost,
                 *, keys: Sequence[str], seed: int = 0, min_window_s: float = 1.0) -> Measured:
    """Run one pass with the plan's clocks on the simulated GPU (hooks) and measure it."""
    pairs = {k: (sm, mem) for k, sm, mem in zip(keys, plan.sm_mhz, plan.mem_mhz,
                                                strict=True)}
    ops = traced_step(model, count, pairs, physics.default_pair)
    return measure(_simulated_backend(physics, seed), ops, min_window_s)




def simulated_plans(model: Any, count: LayerCount, physics: LayerPhysics,
                    slowdowns: Sequence[float] = SLOWDOWNS, *,
                    calls: Sequence[tuple[str, int]] | None = None, seed: int = 0,
                    min_window_s: float = 1.0) -> ClockPlans:
    """`plan_record` on the simulated GPU, the step's default and exhaustive plans run.

    Why run them: the search's costs are the simulator's predictions; running each plan
    with its clocks set by the hooks checks them (``executed``, per plan name).
    """
    plans = plan_record(physics, count, slowdowns, calls=calls)
    scope = "training step" if count.train else "forward"
    block = plans.scopes[scope]
    chosen = {"default": block.default,
              **{f"exhaustive {e.max_slowdown:.0%}": e.exhaustive for e in block.plans}}
    executed = {name: execute_plan(model, count, physics, plan, keys=block.keys, seed=seed,
                                   min_window_s=min_window_s).to_record()
                for name, plan in chosen.items()}
    return replace(plans, scopes={**plans.scopes, scope: replace(block, executed=executed)},
                   clocks=ClockSource(source=SIMULATED_CLOCKS))


def predicted_plans(physics: LayerPhysics, clocks: ClockSource, count: LayerCount,
                    slowdowns: Sequence[float] = SLOWDOWNS, *,
                    calls: Sequence[tuple[str, int]] | None = None) -> ClockPlans:
    """`plan_record` for a real GPU: its clocks (``clocks``), the simulated power model.

    Nothing is run or changed: the plans are a prediction, and the record says so.
    """
    return replace(plan_record(physics, count, slowdowns, calls=calls), clocks=clocks,
                   note="predicted from the simulated GPU's model with this GPU's measured "
                        "roofline; nothing was changed")
