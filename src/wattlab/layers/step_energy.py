"""Per-layer time and energy inside real training steps, and their sums against the step.

Why one place: `wattlab layers --measure` on a real GPU and bench/layers_real.py (live or
from saved captures) both turn one case's captures (capture.py) into the same rows:

- time: each row's GPU busy time per step from the hooked trace's kernels
  (kernel_trace.py), ``between layers`` for kernels outside every layer, and
  ``GPU idle (host-bound)`` = the plain profiled step's period − its busy time. Their sum
  is checked against the plain step timed with no profiler and no hooks.
- power: equivalent-time sampling of the plain run (equivalent_time.py) over the step's
  layout: the plain profiled run's mean kernel layout where its kernels are the hooked
  run's (same names in the same order), else the hooked run's kernels back to back (busy
  time only: no idle row, and the note says why). Energy = power × the row's share of the
  measured run's step; their sum is checked against the energy counter per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from wattlab.layers.capture import Captured
from wattlab.layers.equivalent_time import DELAY_S, Folded, fold
from wattlab.layers.in_step import BETWEEN, HOST_BOUND
from wattlab.layers.kernel_trace import (
    IDLE,
    LayerTimes,
    Layout,
    busy_layout,
    layer_times,
    match_steps,
    mean_layout,
    read_trace,
    split_steps,
    template,
)
from wattlab.runfile import FoldedMeasured, FoldedSumCheck, StepTotals, TimeEnergy

EMPTY_ROW = TimeEnergy(time_s=0.0, time_se_s=0.0, energy_j=0.0, energy_se_j=0.0)


@dataclass(frozen=True)
class StepEnergy:
    """One case's rows (``key`` -> time, power, energy, each ± se) and the sums' check."""

    rows: dict[str, FoldedMeasured]
    check: FoldedSumCheck


def layout_and_idle(c: Captured, reference: list[Any]) -> tuple[Layout, LayerTimes | None, str]:
    """The step's layout, the plain profiled run's times (None: not usable) and why."""
    if c.plain_trace is None:
        return busy_layout(reference), None, "no plain profiled run: GPU busy time only"
    matched = match_steps(read_trace(c.plain_trace, ranges=False), reference)
    # the first step starts on an empty GPU queue: its kernels wait for the host's first
    # launches (15 ms of a 19 ms ResNet50 step on an H200), which a training loop never does
    matched = matched[1:] if len(matched) > 2 else matched
    if not matched:
        return busy_layout(reference), None, (
            "the plain profiled run's kernels differ from the hooked run's (names or order): "
            "GPU busy time only")
    return mean_layout(matched), layer_times(matched), (
        f"idle from {len(matched)} plain profiled steps after the first")


def analyse(c: Captured, *, delay_s: float = DELAY_S) -> StepEnergy:
    """Rows (``key`` -> time, power, energy, each ± se) and the sums' check."""
    steps = split_steps(read_trace(c.hooked_trace))
    times = layer_times(steps)
    layout, plain, note = layout_and_idle(c, template(steps))
    folded = fold(layout, c.run.step_start_unix_s, c.run.sample_unix_s, c.run.sample_power_w,
                  delay_s=delay_s, counter_j=c.run.counter_j)
    time_s, time_se_s = dict(times.time_s), dict(times.time_se_s)
    if plain is not None:
        time_s[IDLE], time_se_s[IDLE] = plain.idle_s, plain.idle_se_s
    power = {r.key: r for r in folded.rows}
    rows = {}
    for key, t in time_s.items():
        r = power.get(key)
        rows[key] = FoldedMeasured(
            time_s=t, time_se_s=time_se_s[key], power_w=r.power_w if r else None,
            power_se_w=r.power_se_w if r else None,
            power_stat_se_w=r.power_stat_se_w if r else None,
            power_delay_w=r.power_delay_w if r else None, energy_j=r.energy_j if r else 0.0,
            energy_se_j=r.energy_se_j if r else 0.0)
    outside = {k: rows.pop(k) for k in (BETWEEN, IDLE) if k in rows}
    return StepEnergy(rows, check(times, plain, folded, c.plain_step_s, note=note,
                                       outside=outside))


def host_bound_warning(plain_step_s: float, profiled_s: float | None, run_step_s: float
                       ) -> str | None:
    """Why the idle row is only an upper bound, when instruments slow the step down.

    A step the GPU finishes before the host has launched the next one waits on the host;
    the profiler's and the sample reader's own host work then lengthen the GPU's idle time,
    so what the profiled run shows is more idle than the plain step has.
    """
    slowest_s = max(profiled_s or 0.0, run_step_s)
    if slowest_s <= plain_step_s * (1 + HOST_BOUND):
        return None
    profiled = "" if profiled_s is None else f", {1e3 * profiled_s:.2f} ms under the profiler"
    return (f"the host sets this step's pace ({1e3 * plain_step_s:.2f} ms timed alone{profiled}, "
            f"{1e3 * run_step_s:.2f} ms beside the sample reader): the GPU idles while it waits "
            f"and every instrument's host work lengthens that idle, so the idle row is an upper "
            f"bound and the layers' GPU busy times are what the step itself holds; a larger "
            f"batch makes the step GPU-bound")


def check(times: LayerTimes, plain: LayerTimes | None, folded: Folded, plain_step_s: float,
          *, note: str, outside: dict[str, FoldedMeasured]) -> FoldedSumCheck:
    """The rows' sums against the whole step measured directly (time and energy).

    ``outside``: the rows outside every layer (``between layers``, the GPU's idle).
    """
    t = times.busy_s + (plain.idle_s if plain else 0.0)
    t_se = math.hypot(times.busy_se_s, plain.idle_se_s if plain else 0.0)
    whole_j = folded.counter_j if folded.counter_j is not None else math.nan
    whole_se = folded.counter_se_j if folded.counter_se_j is not None else math.nan
    return FoldedSumCheck(
        layers_time_s=t, layers_time_se_s=t_se, busy_s=times.busy_s,
        idle_s=plain.idle_s if plain else None, layers_energy_j=folded.energy_j,
        layers_energy_se_j=folded.energy_se_j,
        whole=StepTotals(time_s=plain_step_s, energy_j=whole_j, energy_se_j=whole_se,
                         run_step_s=folded.step_s),
        time_error=t / plain_step_s - 1, energy_error=folded.energy_j / whole_j - 1,
        hooked_steps=times.steps, run_steps=folded.steps, samples=folded.samples,
        bins=int(folded.profile_w.size), delay_s=folded.delay_s, note=note,
        warning=host_bound_warning(plain_step_s, plain.period_s if plain else None,
                                   folded.step_s),
        outside_rows=outside, between=outside.get(BETWEEN, EMPTY_ROW))
