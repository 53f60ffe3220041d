"""`wattlab energy RUN --by-request`: each request's energy, prefill and decode apart.

Each request is two activities: prefill (its start, or when it was scheduled where the log
says, to first token) and decode (first token to end); a request without a first token is
all prefill. Idle is given, or measured where
no request is in flight. Two rules, both learnt from the run itself:

- ``alone`` (the default): the run's dynamic energy shared in proportion to each request's
  predicted alone energy (``request_alone``), what issue 40 defines as a request's cost;
- ``in-flight``: each piece's dynamic energy shared among the requests in flight then, by
  the fitted power of one prefill and one decode (``learn.fit_weights``).

The attribution core keeps idle apart and checks parts + unattributed + idle = total.
Each request's ``rule_pm_j`` is how far its energy moves when each of the rule's powers
moves by its ± (in quadrature): the fit's share of the error, not the rule's own.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from wattlab.analysis.attribution.core import Activity, Attribution, attribute
from wattlab.analysis.attribution.learn import fit_weights, measure_idle
from wattlab.analysis.attribution.power_stream import PowerStream, run_power_stream
from wattlab.analysis.attribution.request_alone import (
    alone_attribution,
    fit_alone_power,
    priced_activities,
    unqueued_activities,
)
from wattlab.analysis.attribution.request_log import Request, read_requests
from wattlab.analysis.attribution.rule import Param, Rule
from wattlab.analysis.energy import energy_report
from wattlab.errors import UsageError
from wattlab.runfile import Run

KINDS = ["prefill", "decode"]
REQUEST_RULES = ("alone", "in-flight")  # `--by-request --rule`, the default first
# `wattlab export --by-request`'s columns -> pyarrow type
REQUEST_COLUMNS = {
    "run": "string", "stream": "string", "valid": "bool", "rule": "string",
    "idle_w": "float64", "id": "string", "start_s": "float64", "end_s": "float64",
    "prompt_tokens": "int64", "output_tokens": "int64", "prefill_j": "float64",
    "decode_j": "float64", "energy_j": "float64", "rule_pm_j": "float64",
    "j_per_output_token": "float64",
    "ttft_s": "float64", "itl_s": "float64",
}
IDLE_MIN_S = 0.5  # a stretch with no request in flight shorter than this is not idle
RESOLVE_EDGES = 4.0  # pieces shorter than this many edge times do not enter the fit


@dataclass
class RequestEnergy:
    """One request: its energy (dynamic, above idle) by kind, tokens and latencies."""

    id: str
    start_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int
    prefill_j: float
    decode_j: float
    energy_j: float
    rule_pm_j: float  # how far the energy moves with the rule's weights by their ±
    j_per_output_token: float | None
    ttft_s: float | None
    itl_s: float | None


@dataclass
class ByRequest:
    """Every request's energy, the rule and the split's totals, the stream's verdict."""

    path: str
    stream: PowerStream
    idle_pm_w: float | None
    idle_how: str
    attribution: Attribution
    requests: list[RequestEnergy]

    def summary(self) -> dict[str, Any]:
        """J per output token (median, p90) and the latencies' medians."""
        per_token = [r.j_per_output_token for r in self.requests
                     if r.j_per_output_token is not None]

        def q(xs: list[float], p: float) -> float | None:
            return float(np.quantile(xs, p)) if xs else None

        ttft = [r.ttft_s for r in self.requests if r.ttft_s is not None]
        itl = [r.itl_s for r in self.requests if r.itl_s is not None]
        return {"requests": len(self.requests),
                "j_per_output_token_median": q(per_token, 0.5),
                "j_per_output_token_p90": q(per_token, 0.9),
                "ttft_median_s": statistics.median(ttft) if ttft else None,
                "itl_median_s": statistics.median(itl) if itl else None}

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, **self.stream.verdict_json(),
                "idle_pm_w": self.idle_pm_w, "idle_how": self.idle_how,
                "attribution": self.attribution.to_json(), "summary": self.summary(),
                "requests": [asdict(r) for r in self.requests]}


def activities_of(requests: list[Request]) -> list[Activity]:
    """Prefill and decode of each request (a request without a first token: prefill only)."""
    out = []
    for r in requests:
        first = r.end_s if r.first_token_s is None else r.first_token_s
        out.append(Activity(r.id, "prefill", r.prefill_start_s, first))
        if first < r.end_s:
            out.append(Activity(r.id, "decode", first, r.end_s))
    return out


def request_row(r: Request, parts: dict[tuple[str, str], float], rule_pm_j: float
                ) -> RequestEnergy:
    """One request's figures from the core's parts."""
    pre, dec = parts.get((r.id, "prefill"), 0.0), parts.get((r.id, "decode"), 0.0)
    ttft = None if r.first_token_s is None else r.first_token_s - r.start_s
    itl = (None if r.first_token_s is None or r.output_tokens < 2
           else (r.end_s - r.first_token_s) / (r.output_tokens - 1))
    per_token = (pre + dec) / r.output_tokens if r.output_tokens else None
    return RequestEnergy(r.id, r.start_s, r.end_s, r.prompt_tokens, r.output_tokens, pre, dec,
                         pre + dec, rule_pm_j, per_token, ttft, itl)


def energy_by_request(run: Run, *, idle_w: float | None = None, rule: str = REQUEST_RULES[0]
                      ) -> ByRequest:
    """Each request's share of the run's energy by ``rule`` (module doc)."""
    if rule not in REQUEST_RULES:
        raise UsageError(f"--rule {rule!r} does not share requests: give one of "
                         + ", ".join(REQUEST_RULES))
    table = read_requests(run)
    if table is None:
        raise UsageError(f"{run.path}: no request table; add one with `wattlab import requests "
                         f"LOG --into {run.path}`")
    requests = table[0]
    stream = run_power_stream(run, energy_report(run, by_marker=False))
    acts = activities_of(requests)
    idle_pm: float | None = 0.0
    how = "given (--idle-w)"
    if idle_w is None:
        got = measure_idle(stream.t_s, stream.power_w, [(a.t0_s, a.t1_s) for a in acts],
                           guard_s=max(stream.edge_s, 0.1), min_s=IDLE_MIN_S)
        if got is None:
            raise UsageError(f"{run.path}: no stretch of >= {IDLE_MIN_S:g} s without a request "
                             "in flight to measure idle power on: give --idle-w")
        idle_w, idle_pm = got[0], got[1]
        how = f"measured on {stream.name} over {got[2]:.2f} s with no request in flight"
    if rule == "alone":
        acts = unqueued_activities(requests, acts)
    fit = fit_alone_power if rule == "alone" else fit_weights
    learnt = fit(stream.t_s, stream.power_w, idle_w, acts, kinds=KINDS,
                 min_piece_s=RESOLVE_EDGES * stream.edge_s)
    share: Callable[[Rule], Attribution] = partial(
        attribute, stream.t_s, stream.power_w, idle_w, acts, span_s=stream.run_s)
    if rule == "alone":
        priced, notes, caveats = priced_activities(requests, acts)
        learnt = replace(learnt, notes=[*learnt.notes, *notes],
                         caveats=[*learnt.caveats, *caveats])
        share = alone_attribution(share, priced)
    att = share(learnt)
    pm = share_spread(share, att)
    return ByRequest(run.path, stream, idle_pm, how, att,
                     [request_row(r, att.parts_j, pm.get(r.id, 0.0)) for r in requests])


def rule_moves(stream: PowerStream, idle_w: float, acts: list[Activity], att: Attribution
               ) -> list[dict[str, float]]:
    """``share_moves`` of the core rule on ``stream``."""
    return share_moves(partial(attribute, stream.t_s, stream.power_w, idle_w, acts,
                               span_s=stream.run_s), att)


def share_moves(share: Callable[[Rule], Attribution], att: Attribution
                ) -> list[dict[str, float]]:
    """Per weight with a ±, each owner's energy change (signed) with it moved by its ±.

    Signed, not squared: a set of owners moves by the sum of its owners' changes, which the
    zero-sum split cancels across a set that holds every owner (``process_rule.RuleError``).
    """
    base, out = att.by_owner(), []
    for kind, p in att.rule.weights.items():
        if not p.pm:
            continue
        moved = replace(att.rule, weights=att.rule.weights | {kind: Param(p.value + p.pm)})
        other = share(moved).by_owner()
        out.append({owner: other.get(owner, 0.0) - e for owner, e in base.items()})
    return out


def share_spread(share: Callable[[Rule], Attribution], att: Attribution) -> dict[str, float]:
    """Each owner's energy change with each weight moved by its ±, in quadrature."""
    moves = share_moves(share, att)
    return {owner: sum(m[owner] ** 2 for m in moves) ** 0.5 for owner in att.by_owner()}


def request_rows(path: str, rule: str = REQUEST_RULES[0]) -> list[dict[str, Any]]:
    """One table row per request of a run file (`wattlab export --by-request`)."""
    with Run(path) as run:
        split = energy_by_request(run, rule=rule)
    a = split.attribution
    common = {"run": path, "stream": split.stream.name, "valid": split.stream.valid,
              "rule": a.rule.name, "idle_w": a.idle_w}
    return [common | asdict(r) for r in split.requests]


def format_by_request(result: ByRequest, limit: int = 20) -> str:
    """The split's totals, the rule, the summary, then the first ``limit`` requests."""
    a, s = result.attribution, result.summary()
    lines = [f"stream: {result.stream.name} (valid: {'yes' if result.stream.valid else 'NO'})"]
    lines += [f"  ! {why}" for why in result.stream.invalid_reasons]
    lines += [f"rule: {a.rule.name}: {a.rule.description}"]
    lines += [f"  w_{k} = {p.value:.2f} ± {p.pm or 0:.2f} {p.unit}"
              for k, p in a.rule.weights.items()] + [f"  {n}" for n in a.rule.notes]
    lines += [f"  ! {c}" for c in a.rule.caveats]
    lines += [f"total {a.total_j:.2f} J = requests {sum(a.parts_j.values()):.2f} J + idle "
              f"{a.idle_j:.2f} J ({a.idle_w:.2f} ± {result.idle_pm_w or 0:.2f} W, "
              f"{result.idle_how}) + no request in flight {a.unattributed_j:.2f} J",
              f"J per output token: median {_f(s['j_per_output_token_median'])}, p90 "
              f"{_f(s['j_per_output_token_p90'])}; TTFT median {_f(s['ttft_median_s'])} s, "
              f"inter-token median {_f(s['itl_median_s'])} s",
              f"{'request':<16} {'prefill J':>10} {'decode J':>10} {'J':>10} {'± rule':>7} "
              f"{'out tok':>8} {'J/tok':>8} {'TTFT s':>8} {'ITL s':>8}"]
    for r in result.requests[:limit]:
        lines.append(f"{r.id:<16} {r.prefill_j:10.3f} {r.decode_j:10.3f} {r.energy_j:10.3f} "
                     f"{r.rule_pm_j:7.3f} "
                     f"{r.output_tokens:8d} {_f(r.j_per_output_token):>8} {_f(r.ttft_s):>8} "
                     f"{_f(r.itl_s):>8}")
    if len(result.requests) > limit:
        lines.append(f"… {len(result.requests) - limit} more (--json for all)")
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"
