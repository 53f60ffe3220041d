"""The ``activity`` rule: each process's power per unit of its work, learnt on the run itself.

Why per process: SM utilisation is not power. A loop of small kernels keeps the SM "busy"
at a tenth of a matrix product's power (issue 41), so no weight per kind of work
(SM %, memory %) shared by all processes can tell them apart. Each process's own power
per unit of SM activity is measured where it worked alone in the run: its samples outside
every other process's ``working`` spans, their dynamic energy over their SM
activity-seconds (not where its activity is the device's utilisation: another scale). A
process that never worked alone gets its weight fitted by least
squares (``learn.fit_weights``) on the power the measured processes leave; where that
cannot be told apart, the kinds' weights (``w_sm * sm + w_mem * mem``) on that power; else
the mean of the others' own weights with a ± as large (its power was never seen); where
nothing can be fitted, Kepler's rule, said so. On a time-sliced GPU a weight fitted on the
power left, a process's own or a kind's, gets a ± as large as itself: which process the
driver named confounds that power.

Why windows of ``SHARE_S`` on a time-sliced GPU: it names one process per driver sample,
with the device's utilisation; shared sample by sample, the process named takes the whole
interval's power. Over a window of several samples each process's activity is the time it
was named times what was reported: its share of the GPU's time. Where the driver names
every working process in its samples, a window of one driver period: a longer one spreads
each process's activity evenly over it, and where one process started or paused inside,
gave part of its joules to the other (the simulated GPU: 10 J in a window, the
small-kernel process 2-3 % low over its run).

The rule's own ± (``RuleError``) is given for any set of a GPU's processes, one process or
a job's: the split is zero-sum, so a set is wrong only by joules moved across its edge.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from wattlab.analysis.attribution.core import (
    Activity,
    Attribution,
    FloatArray,
    attribute,
    cumulative_energy,
)
from wattlab.analysis.attribution.learn import fit_weights
from wattlab.analysis.attribution.power_stream import PowerStream
from wattlab.analysis.attribution.process_table import DRIVER_PERIOD_S, Process, ProcessTable
from wattlab.analysis.attribution.rule import Param, Rule

SHARE_S = 1.0  # the window each process's activity is averaged over on a time-sliced GPU
MIN_ALONE_S = 0.5  # less time working alone than this does not measure a process's power
KINDS = ["sm", "mem"]


def windowed(p: Process, edges: Sequence[float]) -> list[tuple[float, float, float, float]]:
    """(t0, t1, mean SM, mean memory) of ``p`` per window it has samples in."""
    t0, t1 = np.asarray(p.t0_s), np.asarray(p.t1_s)
    sm, mem = np.asarray(p.sm), np.asarray(p.mem)
    out = []
    for a, b in pairwise(edges):  # the samples in time order: only those overlapping [a, b]
        i, j = int(np.searchsorted(t1, a, "right")), int(np.searchsorted(t0, b, "left"))
        over = np.clip(np.minimum(t1[i:j], b) - np.maximum(t0[i:j], a), 0.0, None)
        if over.sum() <= 0:
            continue
        seen = over > 0
        lo, hi = max(a, float(t0[i:j][seen].min())), min(b, float(t1[i:j][seen].max()))
        out.append((lo, hi, float(over @ sm[i:j] / over.sum()),
                    float(over @ mem[i:j] / over.sum())))
    return out


def share_window_s(sliced: bool) -> float:
    """The window the energy is shared on: ``SHARE_S`` on a time-sliced GPU, else one period.

    The module doc says why.
    """
    return SHARE_S if sliced else DRIVER_PERIOD_S


def windows(stream: PowerStream, table: ProcessTable, window_s: float
            ) -> dict[str, list[tuple[float, float, float, float]]]:
    """Each active process's windowed activity over the run (``windowed``)."""
    span = stream.run_s
    edges = [*np.arange(span[0], span[1], window_s).tolist(), span[1]]
    return {p.key: windowed(p, edges) for p in table.processes if p.active}


def by_kind(wins: dict[str, list[tuple[float, float, float, float]]], keys: list[str],
            kinds: list[str] | None) -> list[Activity]:
    """The activities of ``keys``: each its own kind (``kinds`` None), else one per kind."""
    return [Activity(k, kind, a, b, m if kind == "mem" else s) for k in keys
            for a, b, s, m in wins[k] for kind in (kinds or [k])]


def working(p: Process) -> list[tuple[float, float]]:
    """Where ``p`` worked: its active samples, joined across pauses shorter than SHARE_S.

    A time-sliced GPU names a process only in some of the samples while it works; a pause
    this short is that, not the process resting.
    """
    out: list[tuple[float, float]] = []
    for a, b, s, m in zip(p.t0_s, p.t1_s, p.sm, p.mem, strict=True):
        if s + m <= 0:
            continue
        if out and a - out[-1][1] < SHARE_S:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def own_weights(stream: PowerStream, base_w: float, table: ProcessTable
                ) -> dict[str, Param]:
    """Each process's W per unit of SM activity where it worked alone (module doc)."""
    span = stream.run_s
    busy = {p.key: working(p) for p in table.processes if p.active}
    own: dict[str, Param] = {}
    for p in table.processes:
        others = [x for k, spans in busy.items() if k != p.key for x in spans]
        alone = [(a, b, s) for a, b, s in zip(p.t0_s, p.t1_s, p.sm, strict=True)
                 if s > 0 and span[0] <= a and b <= span[1] and (a, b) not in p.from_device
                 and not any(a < y and x < b for x, y in others)]
        if sum(b - a for a, b, _ in alone) < MIN_ALONE_S:
            continue
        ends = np.array([(a, b) for a, b, _ in alone]).ravel()
        dt = np.array([b - a for a, b, _ in alone])
        e = np.diff(cumulative_energy(stream.t_s, stream.power_w, ends))[::2] - base_w * dt
        work = np.array([s for *_, s in alone]) * dt
        ratios = e / work
        pm = float(np.std(ratios, ddof=1) / np.sqrt(ratios.size)) if ratios.size > 1 else None
        own[p.key] = Param(float(e.sum() / work.sum()), pm, "W")
    return own


def unmeasured(own: dict[str, Param]) -> dict[str, Param]:
    """The weights measured alone that measure nothing: not positive, ± as large, or no ±.

    A process's power cannot be below nothing: on the lent H200 a small-kernel process that
    started with a matrix product "measured" -91 ± 240 W per unit of SM on its few samples
    before the other ramped, and printed -13 J. A weight from one sample alone has no ± (a
    spread needs two): it may be off by as much as itself, yet taken as exact it added
    nothing to anyone's ± (the H200's copy + small-kernel pair: 40 W on one 0.8 s sample).
    Such a process is handled as one that never worked alone.
    """
    return {k: w for k, w in own.items() if w.value <= 0 or w.pm is None or w.pm >= w.value}


def unmeasured_note(key: str, w: Param) -> str:
    """Why a weight measured alone was not taken (``unmeasured``)."""
    why = ("from one sample: its ± cannot be estimated" if w.pm is None
           else "not positive, or its ± as large")
    pm = "" if w.pm is None else f" ± {w.pm:.2g}"
    return (f"{key}: its samples alone gave {w.value:.4g}{pm} W per unit of SM, which "
            f"measures nothing ({why}): taken as never alone")


def power_of(t_s: FloatArray, acts: list[Activity], weights: dict[str, Param]) -> FloatArray:
    """The power the rule gives ``acts`` at each time of ``t_s`` (W)."""
    diff = np.zeros(t_s.size + 1)
    i0 = np.searchsorted(t_s, [a.t0_s for a in acts])
    i1 = np.searchsorted(t_s, [a.t1_s for a in acts])
    np.add.at(diff, i0, [weights[a.kind].value * a.intensity for a in acts])
    np.add.at(diff, i1, [-weights[a.kind].value * a.intensity for a in acts])
    out: FloatArray = np.cumsum(diff)[:-1]
    return out


def activity_rule(stream: PowerStream, base_w: float, table: ProcessTable, min_piece_s: float,
                  *, sliced: bool = False, window_s: float = SHARE_S
                  ) -> tuple[Rule, list[Activity], list[str]]:
    """The rule, the activities it shares by, and the kinds its error is checked on.

    A process that never worked alone: its own weight fitted by least squares on the power
    the measured processes leave (identifiable where the unmeasured ones' activities vary
    apart), else the kinds' weights on that power, else the mean of the measured weights
    with a ± as large, else (nothing measured or fitted) Kepler's rule. On a ``sliced``
    (time-sliced) GPU the power left is confounded by which process the driver named: a
    weight fitted on it, a process's own or a kind's, gets a ± as large as itself
    (``fitted_on_left``). Weights are fitted on ``SHARE_S`` windows; the energy is shared
    on windows of ``window_s`` (``share_window_s``).
    """
    wins = windows(stream, table, table.window_s or SHARE_S)
    share = wins if table.window_s or window_s == SHARE_S else windows(stream, table, window_s)
    if not wins:
        return Rule("activity", DESCRIPTION, {}, ["no process showed activity: no dynamic "
                                                  "energy to share"]), [], []
    own = {k: w for k, w in own_weights(stream, base_w, table).items() if k in wins}
    bad = unmeasured(own)
    own = {k: w for k, w in own.items() if k not in bad}
    acts = by_kind(wins, [k for k in wins if k in own], None)
    shared = by_kind(share, [k for k in share if k in own], None)
    notes = [f"own power per unit of SM activity, where each worked alone (>= {MIN_ALONE_S:g} "
             "s): " + (", ".join(own) or "none")]
    notes += [unmeasured_note(k, w) for k, w in bad.items()]
    never = [k for k in wins if k not in own]
    if not never:
        return Rule("activity", DESCRIPTION, own, notes), shared, list(own)
    caveats = [f"{', '.join(never)} never worked alone in this run: "
               f"{'its' if len(never) == 1 else 'their'} power per unit of work is not measured "
               "but fitted on what the others leave, or borrowed: the share is known only to "
               "its ±"]
    left_w = stream.power_w - power_of(stream.t_s, acts, own) if own else stream.power_w
    each = by_kind(wins, never, None)
    fitted = fit_weights(stream.t_s, left_w, base_w, each, kinds=never, min_piece_s=min_piece_s)
    if fitted.name != "equal":
        weights, note = fitted_on_left("their own weights", fitted, sliced)
        return (Rule("activity", DESCRIPTION, own | weights, [*notes, note],
                     fitted.caveats + caveats), shared + by_kind(share, never, None),
                [*own, *never])
    rest = by_kind(wins, never, KINDS)
    kinds = fit_weights(stream.t_s, left_w, base_w, rest, kinds=KINDS, min_piece_s=min_piece_s)
    if kinds.name != "equal":
        weights, note = fitted_on_left("weights of kinds of work", kinds, sliced)
        return (Rule("activity", DESCRIPTION, own | weights, [*notes, note],
                     kinds.caveats + caveats), shared + by_kind(share, never, KINDS),
                [*own, *KINDS])
    if own:
        mean = float(np.mean([p.value for p in own.values()]))
        notes.append("processes never alone: neither their own nor the kinds' weights could be "
                     "fitted (" + "; ".join(kinds.notes) + "): the mean of the others' own "
                     "weights, on their SM activity, ± all of it (their power is not known)")
        return (Rule("activity", DESCRIPTION, own | {"sm": Param(mean, mean, "W"),
                                                     "mem": Param(0.0)}, notes, caveats),
                shared + by_kind(share, never, KINDS), [*own, "sm"])
    return (Rule("utilisation", KEPLER, {"sm": Param(1.0)},
                 [f"activity weights could not be fitted on this run (no process worked alone;"
                  f" {'; '.join(kinds.notes)}): fell back to Kepler's rule"]),
            by_kind(share, never, ["sm"]), ["sm"])


def fitted_on_left(what: str, fitted: Rule, sliced: bool) -> tuple[dict[str, Param], str]:
    """Weights fitted on the power the measured processes leave, and the note saying so.

    On a ``sliced`` (time-sliced) GPU that power is confounded by which process the driver
    named, whatever the weights are of (each process's own, or the kinds'): each weight's ±
    is then at least as large as itself.
    """
    note = (f"processes never alone: {what} fitted on the power the others leave ("
            + "; ".join(fitted.notes) + ")"
            + (", ± all of it: the GPU was time-sliced" if sliced else ""))
    weights = {k: Param(w.value, max(w.pm or 0.0, abs(w.value)), w.unit) if sliced else w
               for k, w in fitted.weights.items()}
    return weights, note


def beside(p: Process, a_s: float, b_s: float) -> bool:
    """Whether ``p`` was working at the read before ``a_s`` or at the one after ``b_s``."""
    i = int(np.searchsorted(p.t1_s, a_s, "right")) - 1
    j = int(np.searchsorted(p.t1_s, b_s, "left"))
    return any(0 <= k < len(p.t1_s) and p.sm[k] + p.mem[k] > 0 for k in (i, j))


@dataclass(frozen=True)
class LateStep:
    """A late step's dynamic energy left to no process, and the processes that may own it."""

    unseen_j: float
    beside: frozenset[str]  # the keys of the processes working at the read before or after


def missed_by_late_reads(stream: PowerStream, base_w: float, table: ProcessTable,
                         acts: list[Activity], rule: Rule) -> tuple[list[LateStep], float]:
    """The dynamic energy of late reads' steps left to no process: (each step, s late).

    Why a ± of its own: the driver answers one sample per process a read, its newest, so a
    read that comes late leaves the samples since the last read unread, and the table
    stretches no row over more than the stream's median step between samples: much of a
    late step's time has no activity, its dynamic energy is in no process's share ("no process
    active"), and each figure is short by whatever part of it was its own. The sampling
    share and the rule's leave-one-out error look only at the samples that were read;
    they cannot see this. Which process drew those joules no row says: each process
    working at the read before or after a late step may own all of them, so all of them go
    into its ±. Late: a step between samples longer than the cadence plus one driver
    period (``late_steps``). A run read on time has none: its ± is unchanged. The seconds
    returned: how far past that the late steps were, in all.
    """
    steps = []
    late_s = 0.0
    lo, hi = stream.run_s
    for a, b in table.late_s:
        if min(b, hi) <= max(a, lo):
            continue
        unseen_j = max(0.0, attribute(stream.t_s, stream.power_w, base_w, acts, rule,
                                      span_s=(max(a, lo), min(b, hi))).unattributed_j)
        late_s += (b - a) - table.read_step_s - DRIVER_PERIOD_S
        steps.append(LateStep(unseen_j, frozenset(p.key for p in table.processes
                                                  if beside(p, a, b))))
    return steps, late_s


def late_reads_note(table: ProcessTable, missed_j: float, late_s: float) -> list[str]:
    """What the split says where reads came late (``missed_by_late_reads``); none if not."""
    if late_s <= 0:
        return []
    return [f"{table.source}'s reads came late: {len(table.late_s)} step(s) between its "
            f"samples longer than its {table.read_step_s:g} s cadence plus a driver period, "
            f"{late_s:.2f} s past it in all (a loaded host?): the driver's samples of that "
            f"time were likely never read, so ~{missed_j:.3g} J of dynamic energy went to no "
            "process (it is in 'no process active'); each process working beside a late "
            "read may own all of it, and has it in its rule ±"]


DESCRIPTION = ("each window's dynamic energy shared in proportion to each process's power: "
               "its own W per unit of SM activity times its activity, or w_sm sm + w_mem mem")
KEPLER = ("Kepler's: each interval's dynamic energy split by the processes' SM-utilisation "
          "share")


@dataclass
class RuleError:
    """What one GPU's rule ± is made of: the ± of any set of its processes, or a job's part.

    Why one formula for both: the split is zero-sum between the processes of a GPU (the dynamic
    energy is measured; the rule only says whose it is), so a set of processes can be wrong only
    by joules that move across its edge. A process's rule ± (docs/process-energy.md, "The ±")
    is built for the process as one unit; a job's or pod's is built the same way for the group
    as one unit, never its processes' ± in quadrature: what the rule moves between two of its
    processes stays inside it. Its three terms, each with the set in the process's place:

    - the rule's leave-one-out error times the GPU's dynamic energy over the union of the
      set's working spans (``worked_spans``), whoever the rule gave it to; none where the set
      holds every working process of the GPU: there is no one outside to move joules to;
    - the weights' ±: the set's summed (signed) change with each weight moved by its ±, in
      quadrature over the weights; over every process the changes sum to zero;
    - late reads: each late step's unseen joules once where any of the set worked beside it
      (they are in "no process active", a shortfall of the processes beside it, not a share
      moved between them: a set holding all of them is short by all of it), added whole.

    A set of one process gets exactly that process's rule ±.
    """

    loo: float | None  # the rule's leave-one-out error, relative (None: not estimated)
    scale: float  # the energy counter over the power stream's integral
    stream: PowerStream
    base_w: float  # idle + static: the dynamic energy is what lies above it
    rule: Rule
    spans_s: dict[str, tuple[float, float]]  # each working process's span (``worked_spans``)
    moves_j: list[dict[str, float]]  # per weight with a ±: each process's change (stream J)
    late: list[LateStep]
    base_moves_j: dict[str, float]  # each process's change with idle + static up by its ±

    def own_j(self, keys: Collection[str]) -> float:
        """The rule's error times the dynamic energy over the set's working spans.

        Within one stretch of the union the misprediction is taken as one (the same weights,
        the same mix); stretches apart in time, in quadrature: a job's processes in three
        pairs run one after another are three mispredictions, not one three times as large
        (linearly, the lent H200's three matrix products of ``h200_shared-pairs2.h5`` in one
        job got ± 3,402 J against a 7.5 J miss).
        """
        spans = [s for k, s in self.spans_s.items() if k in keys]
        if self.loo is None or not spans or set(self.spans_s) <= set(keys):
            return 0.0
        dyn_j = [attribute(self.stream.t_s, self.stream.power_w, self.base_w, [], self.rule,
                           span_s=span).unattributed_j for span in union(spans)]
        return self.loo * math.hypot(*dyn_j) * self.scale

    def spread_j(self, keys: Collection[str]) -> float:
        """The set's change with each weight moved by its ±, in quadrature over the weights."""
        return sum(sum(m.get(k, 0.0) for k in sorted(keys)) ** 2
                   for m in self.moves_j) ** 0.5 * self.scale

    def scatter_j(self, keys: Collection[str]) -> float:
        """The rule's error and the weights' ± of the set, in quadrature."""
        return math.hypot(self.own_j(keys), self.spread_j(keys))

    def late_j(self, keys: Collection[str]) -> float:
        """The late steps' unseen joules where some process of the set worked beside them."""
        return sum(s.unseen_j for s in self.late if not s.beside.isdisjoint(keys)) * self.scale

    def pm_j(self, keys: Collection[str]) -> float:
        """The set's rule ±: the unseen joules are a shortfall the run bounds, added whole."""
        return self.scatter_j(keys) + self.late_j(keys)

    def baseline_j(self, keys: Collection[str]) -> float:
        """The set's dynamic energy change with idle + static moved by its ± (not the rule's).

        Why its own term: every joule above the baseline is dynamic, so an idle measured
        0.6 W high takes 0.6 W from the processes for as long as they worked. Not zero-sum:
        a set holding every process moves by all of it. A GPU's only working process has
        no rule ± (no one to share with), and this is what its ± is then.
        """
        return abs(sum(self.base_moves_j.get(k, 0.0) for k in keys)) * self.scale


def baseline_moves(stream: PowerStream, base_w: float, base_pm_w: float, *,
                   acts: list[Activity], rule: Rule, att: Attribution) -> dict[str, float]:
    """Each owner's dynamic energy change (stream J, signed) with the baseline up by its ±.

    The rule's weights are kept: their own ± is the weights' term.
    """
    if not (math.isfinite(base_pm_w) and base_pm_w > 0):
        return {}
    moved = attribute(stream.t_s, stream.power_w, base_w + base_pm_w, acts, rule,
                      span_s=stream.run_s).by_owner()
    return {owner: moved.get(owner, 0.0) - e for owner, e in att.by_owner().items()}


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The spans joined where they overlap, in time order: each second once."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def worked_spans(run_s: tuple[float, float], table: ProcessTable, sliced: bool = False
                 ) -> dict[str, tuple[float, float]]:
    """Each working process's span its rule ± covers: first working sample to last.

    What its rule ± is the rule's error of, over the GPU's dynamic energy there, anyone's.
    Why not its own: the split is zero-sum, the dynamic energy measured, so joules the rule
    mispredicts go from one process to another, and the run cannot tell whose they are: any
    process working then may own them. Between its first and last working sample a process
    may work unnamed (a time-sliced GPU names one per sample: on the lent H200 a
    small-kernel process went 2.2 s unnamed beside a matrix product; given 0.010 ± 0.006 of
    the pair's joules, its exclusive runs said 0.048). ``sliced`` (the run shows the GPU
    time-sliced): its whole presence, since a 0 % row may then mean "not named" as well as
    "rested" (a small-kernel loop on the H200 read 0 % at its last two reads while it
    worked). A process that never worked has none: no share of what the rule mispredicts.
    """
    out = {}
    for p in table.processes:
        worked = working(p)
        if not worked:
            continue
        t0_s, t1_s = clip(p, run_s) if sliced else (
            max(worked[0][0], run_s[0]), min(worked[-1][1], run_s[1]))
        if t1_s > t0_s:
            out[p.key] = (t0_s, t1_s)
    return out


def clip(p: Process, span: tuple[float, float]) -> tuple[float, float]:
    """``p``'s presence within ``span``."""
    return max(p.present_s[0], span[0]), min(p.present_s[1], span[1])
