"""The `alone` rule of `--by-request`: the run's dynamic energy shared by predicted alone cost.

Why: a batch's power saturates, so sharing each interval's energy among the requests in
flight then (the `in-flight` rule) favours requests that ran in small batches, while what a
request is asked to cost is what it would have cost alone (issue 40's truth). This rule
prices each request's work as if it ran alone and shares the run's dynamic energy in
proportion, so Σ requests + no request in flight + idle = total still holds exactly.

The alone powers are learnt from the run itself: each piece's dynamic power is modelled as
a static part drawn whenever any work is in flight plus a part per activity of each kind,
``s·[busy] + Σ_k c_k n_k``, fitted by least squares weighted by duration; one activity of
kind k alone then draws ``s + c_k``. A request's predicted alone energy is the sum over its
activities of that power times the time the activity would take alone: its prefill's prompt
at the run's unqueued prefill pace, its decode's tokens at the run's least crowded decode
pace. Why not its duration in the run: other requests' work stretches a request's steps (on
the lent H200 the same decode took 3.5 ms a token alone and 7-9 ms in a crowded batch), and
what it would cost alone does not depend on who it ran beside.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from wattlab.analysis.attribution.core import CLOSURE, Activity, Attribution, FloatArray
from wattlab.analysis.attribution.learn import design
from wattlab.analysis.attribution.request_log import Request
from wattlab.analysis.attribution.rule import Param, Rule

NAME = "alone"
DESCRIPTION = ("the run's dynamic energy with a request in flight shared in proportion to "
               "each activity's predicted alone energy: (s + c_k) x the time it takes alone, "
               "s the static part any batch draws, c_k the part per activity of kind k")


QUEUE_QUANTILE = 0.1  # the prefill pace taken as unqueued: this quantile of TTFT per token


def unqueued_activities(requests: Sequence[Request], activities: Sequence[Activity]
                        ) -> list[Activity]:
    """``activities`` with each prefill cut to the time its prompt takes when it does not wait.

    A log's time to first token holds the time a request waited for a place in the batch,
    which costs nothing alone. The run's unqueued prefill pace is the ``QUEUE_QUANTILE``
    quantile of TTFT per prompt token over its requests; a prefill longer than its prompt
    at that pace starts that much before its first token (the rest was waiting).
    """
    pace_s = prefill_pace_s(requests)
    if pace_s is None:
        return list(activities)
    prompt = {r.id: r.prompt_tokens for r in requests}
    return [replace(a, t0_s=max(a.t0_s, a.t1_s - pace_s * prompt[a.owner]))
            if a.kind == "prefill" and prompt[a.owner] > 0 else a for a in activities]


def prefill_pace_s(requests: Sequence[Request]) -> float | None:
    """The run's unqueued prefill pace, seconds a prompt token (None: no prefill to learn on)."""
    paces = [(r.first_token_s - r.prefill_start_s) / r.prompt_tokens for r in requests
             if r.first_token_s is not None and r.prompt_tokens > 0]
    return float(np.quantile(paces, QUEUE_QUANTILE)) if paces else None


def decode_pace_s(requests: Sequence[Request]) -> float | None:
    """The run's least crowded decode pace, seconds a token (None: none made two tokens).

    It is the ``QUEUE_QUANTILE`` quantile of the requests' inter-token latencies.
    """
    paces = [(r.end_s - r.first_token_s) / (r.output_tokens - 1) for r in requests
             if r.first_token_s is not None and r.output_tokens > 1]
    return float(np.quantile(paces, QUEUE_QUANTILE)) if paces else None




def priced_activities(requests: Sequence[Request], activities: Sequence[Activity]
                      ) -> tuple[list[Activity], list[str], list[str]]:
    """``activities`` (prefills already unqueued) as the rule prices them; notes, caveats.

    Each decode lasts its tokens at the run's least crowded pace, from its first token: as
    long for a request that ran in a crowded batch as for one that ran nearly alone.
    """
    decode_s, prefill_s = decode_pace_s(requests), prefill_pace_s(requests)
    if decode_s is None:
        return list(activities), [], []
    steps = {r.id: r.output_tokens - 1 for r in requests}
    priced = [replace(a, t1_s=a.t0_s + decode_s * steps[a.owner]) if a.kind == "decode" else a
              for a in activities]
    notes = [f"each decode priced at its tokens x the run's least crowded decode pace "
             f"({1e3 * decode_s:.3g} ms a token, the {QUEUE_QUANTILE:.0%} quantile of "
             "inter-token latency): steps stretched by other requests' work are free"]
    caveats = []
    if prefill_s is not None and prefill_s >= decode_s and all(
            r.scheduled_s is None for r in requests):
        caveats.append(
            f"the unqueued prefill pace ({1e3 * prefill_s:.3g} ms a prompt token) is no faster "
            f"than a decode step ({1e3 * decode_s:.3g} ms): the log's times to first token "
            "hold time waiting for the batch that the rule cannot take out, so prefill is "
            "overpriced; log each request's scheduled_unix_s")
    return priced, notes, caveats


def fit_alone_power(t_s: FloatArray, power_w: FloatArray, idle_w: float,
                    activities: Sequence[Activity], *, kinds: list[str], min_piece_s: float
                    ) -> Rule:
    """Each kind's dynamic power when one activity of it runs alone (module doc), with ±.

    Where the run cannot separate the parts (too few pieces, a power <= 0) every kind is
    priced alike (shares by duration) and the rule says why.
    """
    dt, p_dyn, n, use = design(t_s, power_w, idle_w, activities, kinds=kinds,
                               min_piece_s=min_piece_s)
    x = np.column_stack([np.ones(int(use.sum())), n[use]])
    y, w = p_dyn[use], np.sqrt(dt[use])
    xw = x * w[:, None]
    if x.shape[0] <= x.shape[1] or np.linalg.matrix_rank(xw) < x.shape[1]:
        return flat_rule(kinds, f"too few pieces with different mixes of {kinds} "
                         f"({x.shape[0]} pieces of >= {1e3 * min_piece_s:.3g} ms)")
    coef, *_ = np.linalg.lstsq(xw, y * w, rcond=None)
    resid = (y - x @ coef) * w
    cov = float(resid @ resid) / (x.shape[0] - x.shape[1]) * np.linalg.inv(xw.T @ xw)
    alone = coef[0] + coef[1:]
    pm = [float(np.sqrt(cov[0, 0] + cov[i, i] + 2 * cov[0, i])) for i in range(1, x.shape[1])]
    if np.any(alone <= 0):
        return flat_rule(kinds, "the fitted alone power of " + ", ".join(
            f"{k} {a:.3g} W" for k, a in zip(kinds, alone, strict=True)) + " is not positive")
    weights = {k: Param(float(a), e, "W") for k, a, e in zip(kinds, alone, pm, strict=True)}
    return Rule(NAME, DESCRIPTION, weights, [
        f"fitted on {x.shape[0]} pieces of >= {1e3 * min_piece_s:.3g} ms: static part "
        f"s = {coef[0]:.3g} W, " + ", ".join(f"c_{k} = {c:.3g} W"
                                            for k, c in zip(kinds, coef[1:], strict=True)),
        "fitted with each prefill cut to its prompt at the run's unqueued pace (time waiting "
        "for the batch is free)"])


def flat_rule(kinds: list[str], why: str) -> Rule:
    """Every kind priced alike: shares by each activity's duration."""
    return Rule(NAME, "the run's dynamic energy with a request in flight shared in proportion "
                "to each activity's duration", {k: Param(1.0) for k in kinds},
                [f"{why}: every kind priced alike"])


def share_by_alone(in_flight: Attribution, activities: Sequence[Activity], rule: Rule
                   ) -> Attribution:
    """``in_flight``'s attributed energy re-shared by each activity's predicted alone energy.

    The total shared, idle and the unattributed part are ``in_flight``'s (an attribution
    whose rule gives every kind a weight > 0, so every piece with work counts as shared).
    """
    shared_j = sum(in_flight.parts_j.values())
    cost: dict[tuple[str, str], float] = {}
    for a in activities:
        seconds = max(0.0, min(a.t1_s, in_flight.t1_s) - max(a.t0_s, in_flight.t0_s))
        key = (a.owner, a.kind)
        cost[key] = cost.get(key, 0.0) + rule.weight(a.kind) * a.intensity * seconds
    total_cost = sum(cost.values())
    parts = ({k: shared_j * c / total_cost for k, c in cost.items()} if total_cost > 0
             else dict(in_flight.parts_j))
    out = replace(in_flight, rule=rule, parts_j=parts)
    if abs(out.closure_j) > CLOSURE * max(abs(out.total_j), 1e-12):
        raise RuntimeError(f"alone shares do not add up: {out.closure_j:.6g} J of "
                           f"{out.total_j:.6g} J (a bug in wattlab)")
    return out


def alone_attribution(attribute_with: Callable[[Rule], Attribution],
                      activities: Sequence[Activity]) -> Callable[[Rule], Attribution]:
    """The `alone` rule as a function of its powers (for the shares and their ±)."""
    return lambda rule: share_by_alone(attribute_with(rule), activities, rule)
