"""A simulated LLM server on the simulated GPU: counters, a request log and the truth.

The engine's steps come from :mod:`wattlab.hardware.serving_plan` (staggered requests,
continuous batching, prefill then decode, a batch power that saturates); the simulated GPU
runs them as its workload, so its power (and every NVML view of it) is the batch's. The
server serves its counters on a real local Prometheus endpoint under vLLM's metric names,
writes the request log of docs/serving.md (absolute wall-clock times) and a truth JSON.

Why each request's truth is its alone-energy: in a batch, energy has no owner (the static
part is shared, the saturating parts are not sums), so the only definition that does not
presuppose a sharing rule is what the simulator spends on the request served on its own at
the same settings: its dynamic energy (above idle) from the simulated GPU, run on a plan of
that request alone. A sharing rule is judged by how its shares compare with these.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from wattlab.hardware.metrics_endpoint import MetricsEndpoint
from wattlab.hardware.serving_plan import (
    Request,
    ServerPhysics,
    ServingPlan,
    plan_serving,
    staggered_requests,
)
from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu, WorkloadSchedule

MODEL_NAME = "simulated-llm"
LEAD_S = 1.0  # idle before the first request: the analysis learns idle power here
TAIL_S = 1.0
FINISH_REASONS = ("stop", "length", "abort")  # vLLM serves each from the start


class SimulatedServer:
    """The server, its GPU and its endpoint; times in ``clock_ns`` (monotonic by default)."""

    def __init__(self, requests: list[Request], *, physics: ServerPhysics | None = None,
                 seed: int = 0, lead_s: float = LEAD_S, tail_s: float = TAIL_S,
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 start_ns: int | None = None, model: GpuModel | None = None) -> None:
        self.physics = physics or ServerPhysics()
        self.requests = requests
        self.seed = seed
        self.plan: ServingPlan = plan_serving(requests, self.physics)
        self.lead_s, self.tail_s = lead_s, tail_s
        self.clock_ns = clock_ns
        self.gpu = SimulatedGpu(0, seed, self.plan.schedule(lead_s, tail_s), clock_ns,
                                start_ns=start_ns, model=model)
        self.serve_start_ns = self.gpu.start_ns + round(lead_s * 1e9)
        self.endpoint = MetricsEndpoint(self.exposition)

    @property
    def duration_s(self) -> float:
        """From the GPU's start to the end of the tail: how long a recording should run."""
        return self.lead_s + self.plan.duration_s + self.tail_s

    def exposition(self) -> str:
        """The counters now, in Prometheus's text format, under vLLM's names."""
        c = self.plan.counters_at((self.clock_ns() - self.serve_start_ns) / 1e9)
        label = f'model_name="{MODEL_NAME}"'
        lines = []
        for name, kind, value in (
                ("vllm:prompt_tokens_total", "counter", c["prompt_tokens"]),
                ("vllm:generation_tokens_total", "counter", c["generation_tokens"]),
                ("vllm:num_requests_running", "gauge", c["running"]),
                ("vllm:num_requests_waiting", "gauge", c["waiting"])):
            lines += [f"# TYPE {name} {kind}", f"{name}{{{label}}} {float(value)}"]
        lines.append("# TYPE vllm:request_success_total counter")
        for reason in FINISH_REASONS:  # every request ends at its length here
            n = c["finished"] if reason == "length" else 0
            lines.append(f'vllm:request_success_total{{finished_reason="{reason}",{label}}} '
                         f"{float(n)}")
        return "\n".join(lines) + "\n"

    def start(self) -> SimulatedServer:
        self.endpoint.start()
        return self

    def stop(self) -> None:
        self.endpoint.stop()

    @property
    def url(self) -> str:
        return self.endpoint.url

    def _unix_s(self, step: int) -> float:
        """Wall-clock time of a step's edge, as the host's clock reads it."""
        t_ns = self.serve_start_ns + round(step * self.physics.step_s * 1e9)
        return (t_ns + self.gpu.unix_offset_ns) / 1e9

    def request_log(self) -> list[dict[str, Any]]:
        """One object per request, in the JSONL format of docs/serving.md."""
        rows = []
        for s in self.plan.served:
            r = s.request
            start = (self.serve_start_ns + round(r.arrival_s * 1e9) + self.gpu.unix_offset_ns)
            rows.append({"id": r.id, "start_unix_s": start / 1e9,
                         # when its first prefill step began, as vLLM logs it
                         "scheduled_unix_s": max(start / 1e9, self._unix_s(s.first_step)),
                         "first_token_unix_s": self._unix_s(s.prefill_end),
                         "end_unix_s": self._unix_s(s.end_step),
                         "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens})
        return rows

    def write_request_log(self, path: str | Path) -> Path:
        out = Path(path)
        out.write_text("".join(json.dumps(row) + "\n" for row in self.request_log()))
        return out

    def truth(self) -> dict[str, Any]:
        """Totals over the serving span and each request's alone-energy (docs/scrape.md)."""
        t0 = self.serve_start_ns
        t1 = t0 + round(self.plan.duration_s * 1e9)
        span_j = self.gpu.true_energy_j(t0, t1)
        idle_j = self.gpu.model.idle_w * self.plan.duration_s
        tokens = int(self.plan.generation_tokens[-1])
        alone = [self.alone(s.request) for s in self.plan.served]
        return {"model": MODEL_NAME, "seed": self.seed, "physics": self.physics.to_json(),
                "gpu": {"name": self.gpu.model.name, "idle_w": self.gpu.model.idle_w,
                        "dynamic_w": self.gpu.model.dynamic_w},
                "serving_span_s": self.plan.duration_s,
                "serving_start_unix_s": (t0 + self.gpu.unix_offset_ns) / 1e9,
                "serving_end_unix_s": (t1 + self.gpu.unix_offset_ns) / 1e9,
                "energy_j": span_j, "dynamic_energy_j": span_j - idle_j,
                "generation_tokens": tokens, "prompt_tokens": int(self.plan.prompt_tokens[-1]),
                "requests_finished": int(self.plan.finished[-1]),
                "j_per_token": span_j / tokens, "dynamic_j_per_token": (span_j - idle_j) / tokens,
                "requests": alone}

    def alone(self, request: Request) -> dict[str, Any]:
        """The request served on its own at the same settings: its dynamic energy, by phase."""
        step_s = self.physics.step_s
        plan = plan_serving([replace(request, arrival_s=0.0)], self.physics)
        served = plan.served[0]
        gpus = [SimulatedGpu(0, self.seed, schedule, lambda: 0, start_ns=0, unix_offset_ns=0,
                             model=self.gpu.model)
                for schedule in (plan.schedule(step_s, step_s),
                                 WorkloadSchedule.constant(0.0, plan.duration_s + 2 * step_s))]

        def dynamic_j(first: int, last: int) -> float:
            a, b = round((first + 1) * step_s * 1e9), round((last + 1) * step_s * 1e9)
            return gpus[0].true_energy_j(a, b) - gpus[1].true_energy_j(a, b)

        prefill_j = dynamic_j(0, served.prefill_end)
        decode_j = dynamic_j(served.prefill_end, served.end_step)
        return {"id": request.id, "prompt_tokens": request.prompt_tokens,
                "output_tokens": request.output_tokens,
                "alone_s": served.end_step * step_s, "alone_dynamic_j": prefill_j + decode_j,
                "alone_prefill_j": prefill_j, "alone_decode_j": decode_j}

    def write_truth(self, path: str | Path) -> dict[str, Any]:
        truth = self.truth()
        Path(path).write_text(json.dumps(truth, indent=1) + "\n")
        return truth


def demo_server(seed: int, requests: int = 60, **kwargs: Any) -> SimulatedServer:
    """The server ``wattlab demo --serving`` and ``wattlab emulate scrape`` run."""
    return SimulatedServer(staggered_requests(requests, seed), seed=seed, **kwargs)


def serve_forever(seed: int) -> int:
    """``wattlab emulate scrape``: one endpoint, a new set of requests after each, until Ctrl-C.

    Each new set is a new server: its counters start again from 0, as after a restart (the
    analysis counts that as a reset).
    """
    current = [demo_server(seed)]

    def text() -> str:  # whichever server is current when the scrape comes
        return current[0].exposition()

    endpoint = MetricsEndpoint(text).start()
    print(f"simulated LLM server (vLLM's metric names): {endpoint.url}  "
          f"(wattlab record --scrape {endpoint.url} ...)", flush=True)
    try:
        for n in itertools.count(1):
            time.sleep(current[0].duration_s)
            current[0] = demo_server(seed + n)
    except KeyboardInterrupt:
        return 0
    finally:
        endpoint.stop()
    return 0
