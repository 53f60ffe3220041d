"""Which SM and memory clock each layer runs at: exhaustive search and the thesis heuristic.

Why dynamic programming: with a cost for every clock change, the best clock pair of a layer
depends on its neighbours'. The search minimises E + λ·T over every plan exactly (the
state is the pair in force; a layer either keeps it or pays one switch, so each layer
costs O(pairs)), and a bisection on λ finds the least energy within a time bound. Every λ
also gives a lower bound on the constrained optimum (E*(λ) − λ·T_max, Lagrangian duality),
so each plan carries ``gap_j``: how far above the true optimum it can at most be.

The heuristic (arithmetic intensity, as in the Chalmers thesis): a memory-bound layer keeps
the default memory clock and takes a lower SM clock; a compute-bound layer keeps the
default SM clock and takes a lower memory clock: the lowest whose predicted time stays
within the slowdown bound, layer by layer, and a change only where it saves more than a
switch costs (``heuristic``). Its plan is costed on the same surface, switches included.

A plan starts and ends at the default clocks (a step repeats: each begins where the default
left it), so switching into the first layer's pair and back is counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.device_models import Roofline
from wattlab.errors import UsageError
from wattlab.runfile import PlanCost

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass
class Surface:
    """Time and energy of every layer (rows) at every clock pair (columns)."""

    time_s: FloatArray  # layers x pairs
    energy_j: FloatArray
    sm_mhz: FloatArray  # per pair
    mem_mhz: FloatArray
    default: int  # index of the default pair
    switch_s: float
    switch_j: float

    def __post_init__(self) -> None:
        if self.time_s.shape != self.energy_j.shape or self.time_s.shape[1] != len(self.sm_mhz):
            raise UsageError("a surface needs time and energy for every layer and clock pair")


@dataclass
class Plan:
    """A clock pair per layer, with its cost on the surface."""

    name: str
    choice: IntArray  # pair index per layer
    time_s: float
    energy_j: float
    switches: int
    gap_j: float | None = None  # at most this far above the optimum within the time bound
    note: str | None = None  # why a plan is worse than the default, where it is

    def to_record(self, surface: Surface, base: Plan) -> PlanCost:
        """The plan as the layer record keeps it, its savings against ``base`` (the default)."""
        return PlanCost(
            name=self.name, time_s=self.time_s, energy_j=self.energy_j,
            switches=self.switches, gap_j=self.gap_j, note=self.note,
            energy_saving=1 - self.energy_j / base.energy_j,
            slowdown=self.time_s / base.time_s - 1,
            # what the same choice would save if clock changes cost nothing
            saving_free_switches=1 - (self.energy_j - self.switches * surface.switch_j)
            / base.energy_j,
            sm_mhz=tuple(int(surface.sm_mhz[c]) for c in self.choice),
            mem_mhz=tuple(int(surface.mem_mhz[c]) for c in self.choice))


def evaluate(surface: Surface, choice: Sequence[int] | IntArray, name: str = "") -> Plan:
    """Cost of a plan: its layers plus a switch wherever the pair changes (from and to default)."""
    c = np.asarray(choice, dtype=np.int64)
    path = np.concatenate([[surface.default], c, [surface.default]])
    switches = int(np.count_nonzero(np.diff(path)))
    rows = np.arange(c.shape[0])
    return Plan(name, c, float(surface.time_s[rows, c].sum() + switches * surface.switch_s),
                float(surface.energy_j[rows, c].sum() + switches * surface.switch_j), switches)


def min_weighted(surface: Surface, lam: float) -> tuple[IntArray, float]:
    """The plan minimising E + λ·T exactly, and that minimum."""
    cost = surface.energy_j + lam * surface.time_s
    sw = surface.switch_j + lam * surface.switch_s
    n_layers, n_pairs = cost.shape
    value = np.full(n_pairs, sw)
    value[surface.default] = 0.0
    stay = np.zeros((n_layers, n_pairs), dtype=bool)
    came = np.zeros(n_layers, dtype=np.int64)  # best pair before layer l (for a switch)
    for layer in range(n_layers):
        if layer == 0:
            came[0] = surface.default
            stay[0] = np.arange(n_pairs) == surface.default
        else:
            came[layer] = int(np.argmin(value))
            switch_in = value[came[layer]] + sw
            stay[layer] = value <= switch_in
            value = np.minimum(value, switch_in)
        value = value + cost[layer]
    end = value + np.where(np.arange(n_pairs) == surface.default, 0.0, sw)
    p = int(np.argmin(end))
    choice = np.zeros(n_layers, dtype=np.int64)
    for layer in range(n_layers - 1, -1, -1):
        choice[layer] = p
        if not stay[layer, p]:
            p = int(came[layer])
    return choice, float(end.min())


def best_within(surface: Surface, max_slowdown: float, name: str = "exhaustive",
                iterations: int = 60) -> Plan:
    """Least-energy plan whose time is within (1 + max_slowdown) × the default plan's."""
    if max_slowdown < 0:
        raise UsageError(f"--max-slowdown must be >= 0, got {max_slowdown}")
    base = evaluate(surface, np.full(surface.time_s.shape[0], surface.default))
    bound_s = base.time_s * (1 + max_slowdown)
    best, lower = base, -math.inf

    def trial(lam: float) -> bool:
        nonlocal best, lower
        choice, value = min_weighted(surface, lam)
        plan = evaluate(surface, choice)
        lower = max(lower, value - lam * bound_s)
        if plan.time_s <= bound_s * (1 + 1e-12) and plan.energy_j < best.energy_j:
            best = plan
        return plan.time_s <= bound_s * (1 + 1e-12)

    lo, hi = 0.0, base.energy_j / base.time_s
    if not trial(lo):
        while not trial(hi):
            lo, hi = hi, hi * 4
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            if trial(mid):
                hi = mid
            else:
                lo = mid
    best.name = name
    best.gap_j = max(0.0, best.energy_j - lower)
    return best


def heuristic(surface: Surface, work_flops: FloatArray, bytes_moved: FloatArray,
              roofline: Roofline, max_slowdown: float = 0.0) -> Plan:
    """The arithmetic-intensity rule (module doc), with switches counted; costed on the surface.

    Per layer, only the knob its roofline class leaves slack moves (the SM clock of a
    memory-bound layer, the memory clock of a compute-bound one; the other stays at the
    default), to the lowest value whose predicted time stays within (1 + max_slowdown) × the
    layer's time at the default clocks. Walking the layers in order, the pair in force is
    kept where it moves only this layer's slack knob, within its bound, and the change
    would save less than one switch costs or its time no longer fits in what the bound
    leaves; otherwise the layer's own pair is set. A plan
    that still comes out slower than the bound or costlier than the default says why
    (``note``: the switches).
    """
    d = surface.default
    sm_d, mem_d = surface.sm_mhz[d], surface.mem_mhz[d]
    memory_bound = (work_flops / np.maximum(bytes_moved, 1.0) < roofline.ridge)[:, None]
    ok = surface.time_s <= surface.time_s[:, d:d + 1] * (1 + max_slowdown) * (1 + 1e-12)
    slack = np.where(memory_bound, (surface.mem_mhz == mem_d)[None, :],
                     (surface.sm_mhz == sm_d)[None, :]) & ok
    knob = np.where(memory_bound, surface.sm_mhz[None, :], surface.mem_mhz[None, :])
    own = np.argmin(np.where(slack, knob, np.inf), axis=1)  # the default is always slack
    choice = np.empty_like(own)
    current = d
    # time left within the bound for switches (one more back to the default at the end)
    budget_s = surface.time_s[:, d].sum() * max_slowdown - surface.switch_s
    for layer, own_pick in enumerate(own):
        pick = int(own_pick)
        gain_j = surface.energy_j[layer, current] - surface.energy_j[layer, pick]
        extra_s = surface.time_s[layer, pick] - surface.time_s[layer, d]
        afford = budget_s >= 2 * surface.switch_s + extra_s  # in, and out again later
        keep = slack[layer, current] and (gain_j <= surface.switch_j or not afford)
        if not keep and not afford:
            pick = d  # forced out of the pair in force, with no time left: the default
        if not keep and current != pick:
            budget_s -= surface.switch_s
        current = current if keep else int(pick)
        budget_s -= surface.time_s[layer, current] - surface.time_s[layer, d]
        choice[layer] = current
    plan = evaluate(surface, choice, "heuristic")
    base = evaluate(surface, np.full(choice.shape[0], d))
    slow = plan.time_s / base.time_s - 1
    if slow > max_slowdown + 1e-9 or plan.energy_j > base.energy_j * 1.01:
        sw_s = plan.switches * surface.switch_s
        plan.note = (f"{plan.switches} clock changes × {surface.switch_s * 1e3:g} ms = "
                     f"{sw_s * 1e3:.3g} ms against a {base.time_s * 1e3:.3g} ms pass: the rule "
                     "bounds each layer's own time, not the switches'")
    return plan
