"""What a simulated LLM server does, step by step: staggered requests, continuous batching.

Why a plan computed up front: the simulated GPU's power comes from a workload schedule, and
the server's counters, its request log and each request's truth must all follow the very
same steps, so the steps are simulated once, here, and everything else reads them.

The engine runs fixed steps of ``step_s``. Each step it admits waiting requests (first come,
first served) while the batch holds fewer than ``max_batch``; a request in the batch first
prefills its prompt, ``prefill_chunk`` tokens a step (the last prefill step gives its first
token), then decodes one token a step until its output is complete. The GPU's utilisation
in a step (its share of the GPU's dynamic power) is NOT a sum of per-request parts: a shared
static part while the batch is not empty, plus prefill and decode parts that saturate with
the work in the step, ``u = static + a_p·(1 − exp(−W_p/k_p)) + a_d·(1 − exp(−N_d/k_d))``
(W_p prompt tokens prefilled, N_d requests decoding).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from wattlab.device_models import Segment, WorkloadSchedule
from wattlab.errors import UsageError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ServerPhysics:
    """The engine's pace and its power shape (utilisations: shares of the dynamic power).

    The default peak (0.58) stays below the simulated H100's 700 W cap, so its clock never
    throttles and the steps keep wall-clock time.
    """

    step_s: float = 0.02
    max_batch: int = 8
    prefill_chunk: int = 256
    static_u: float = 0.12
    prefill_u: float = 0.28
    prefill_k_tokens: float = 400.0
    decode_u: float = 0.18
    decode_k: float = 3.0

    def utilisation(self, prefill_tokens: int, decoding: int) -> float:
        """One step's utilisation; 0 with nothing in the batch."""
        if prefill_tokens == 0 and decoding == 0:
            return 0.0
        return (self.static_u + self.prefill_u * (1 - math.exp(-prefill_tokens
                                                               / self.prefill_k_tokens))
                + self.decode_u * (1 - math.exp(-decoding / self.decode_k)))

    def to_json(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Request:
    """One request as a load generator sends it (arrival in s from the serving start)."""

    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Served:
    """When a request's steps ran: [first_step, prefill_end) prefill, then decode to end."""

    request: Request
    first_step: int
    prefill_end: int  # the step after its last prefill step (its first token at that edge)
    end_step: int  # the step after its last decode step


def staggered_requests(count: int, seed: int, *, mean_gap_s: float = 0.25,
                       prompt_tokens: tuple[int, int] = (64, 1024),
                       output_tokens: tuple[int, int] = (16, 160)) -> list[Request]:
    """``count`` requests with exponential gaps and log-uniform lengths, from ``seed``."""
    if count < 1:
        raise UsageError(f"a simulated server needs at least 1 request, got {count}")
    rng = np.random.default_rng([seed, 0x5E7E])
    arrivals = np.cumsum(rng.exponential(mean_gap_s, count)) - mean_gap_s

    def lengths(lo: int, hi: int) -> IntArray:
        return np.round(np.exp(rng.uniform(math.log(lo), math.log(hi), count))).astype(np.int64)

    prompts, outputs = lengths(*prompt_tokens), lengths(*output_tokens)
    return [Request(f"req-{k:04d}", max(0.0, float(a)), int(p), int(o))
            for k, (a, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True))]


@dataclass
class ServingPlan:
    """Every step of the engine: utilisation, the counters after it, who ran when."""

    physics: ServerPhysics
    served: list[Served]
    utilisation: FloatArray  # per step
    prompt_tokens: IntArray  # cumulative after each step
    generation_tokens: IntArray
    finished: IntArray
    running: IntArray  # in the batch during each step
    waiting: IntArray

    @property
    def duration_s(self) -> float:
        return len(self.utilisation) * self.physics.step_s

    def step_at(self, t_s: float) -> int:
        """Steps completed by ``t_s`` (s from the serving start)."""
        return int(np.clip(math.floor(t_s / self.physics.step_s + 1e-9), 0,
                           len(self.utilisation)))

    def counters_at(self, t_s: float) -> dict[str, int]:
        """The counters as the server reports them at ``t_s``."""
        done = self.step_at(t_s)
        now = min(done, len(self.utilisation) - 1)
        last = done - 1
        running = int(self.running[now]) if 0 <= t_s < self.duration_s else 0
        return {"prompt_tokens": int(self.prompt_tokens[last]) if last >= 0 else 0,
                "generation_tokens": int(self.generation_tokens[last]) if last >= 0 else 0,
                "finished": int(self.finished[last]) if last >= 0 else 0,
                "running": running,
                "waiting": int(self.waiting[now]) if 0 <= t_s < self.duration_s else 0}

    def schedule(self, lead_s: float, tail_s: float) -> WorkloadSchedule:
        """The GPU's workload: idle ``lead_s``, the steps (equal ones merged), idle ``tail_s``."""
        segments = [Segment(lead_s, 0.0, "idle")]
        step = self.physics.step_s
        start = 0
        u = self.utilisation
        for k in range(1, len(u) + 1):
            if k == len(u) or u[k] != u[start]:
                segments.append(Segment((k - start) * step, float(u[start]), "serving"))
                start = k
        segments.append(Segment(tail_s, 0.0, "idle"))
        return WorkloadSchedule(segments)


def plan_serving(requests: list[Request], physics: ServerPhysics) -> ServingPlan:
    """Run the engine's steps until every request is done."""
    order = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    if any(r.prompt_tokens < 1 or r.output_tokens < 1 for r in order):
        raise UsageError("every simulated request needs >= 1 prompt and output token")
    arrivals = np.array([r.arrival_s for r in order])
    batch: list[dict[str, int]] = []  # index in order, tokens left to prefill and decode
    by_index: list[Served | None] = [None] * len(order)
    cols: dict[str, list[float]] = {k: [] for k in ("u", "p", "g", "f", "run", "wait")}
    totals = [0, 0, 0]
    step = 0
    next_new = 0
    while next_new < len(order) or batch:
        t_s = step * physics.step_s
        while next_new < len(order) and order[next_new].arrival_s <= t_s + 1e-12 and \
                len(batch) < physics.max_batch:
            r = order[next_new]
            batch.append({"i": next_new, "prefill": r.prompt_tokens,
                          "decode": r.output_tokens - 1, "first": step, "prefill_end": -1})
            next_new += 1
        waiting = int(np.searchsorted(arrivals, t_s + 1e-12, side="right")) - next_new
        prefill_tokens = sum(min(b["prefill"], physics.prefill_chunk)
                             for b in batch if b["prefill"] > 0)
        decoding = sum(1 for b in batch if b["prefill"] == 0)
        cols["u"].append(physics.utilisation(prefill_tokens, decoding))
        cols["run"].append(len(batch))
        cols["wait"].append(waiting)
        for b in list(batch):
            r = order[b["i"]]
            if b["prefill"] > 0:
                b["prefill"] -= min(b["prefill"], physics.prefill_chunk)
                if b["prefill"] == 0:
                    totals[0] += r.prompt_tokens
                    totals[1] += 1  # the first token
                    b["prefill_end"] = step + 1
                    if b["decode"] == 0:
                        by_index[b["i"]] = Served(r, b["first"], step + 1, step + 1)
                        batch.remove(b)
                        totals[2] += 1
                continue
            b["decode"] -= 1
            totals[1] += 1
            if b["decode"] == 0:
                by_index[b["i"]] = Served(r, b["first"], b["prefill_end"], step + 1)
                batch.remove(b)
                totals[2] += 1
        cols["p"].append(totals[0])
        cols["g"].append(totals[1])
        cols["f"].append(totals[2])
        step += 1
    served = [s for s in by_index if s is not None]
    return ServingPlan(physics, served, np.array(cols["u"]),
                       *(np.array(cols[k], dtype=np.int64) for k in ("p", "g", "f", "run",
                                                                      "wait")))
