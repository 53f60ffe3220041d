"""A real generation server for the per-request and per-token energy checks (real GPU only).

No model can be downloaded on the lent machine: a GPT-2-style transformer is built from its
config with random weights (the energy of a forward pass does not depend on the weights'
values), on the GPU, in bf16. Its default size (24 layers of width 4096: ~4.8 B parameters,
~10 GB) and prompts of 128-1024 tokens make the GPU's work, not Python, set the pace: GPT-2
small with short prompts drew 123 W against 121 W idle on the H200 (BENCHMARKS.md), every
decode step a few microseconds of GPU work behind milliseconds of Python; here each decode
step reads ~10 GB of weights per cohort and each prefill is tens of TFLOP.

Requests arrive staggered (seeded Poisson arrivals, prompt and output lengths
drawn per request); arrived requests are admitted as a cohort while fewer than ``--cap``
are in flight, each cohort prefilled in one batched forward (left-padded) and then decoded
one token a step alongside the other cohorts. The server exposes vLLM's metric names on its
own Prometheus endpoint and writes the per-request JSONL log of docs/serving.md.

``--exclusive`` serves the same requests one at a time, each marked ``request`` with the
GPU synchronised at both edges: the per-request truth the shared run's attribution is
checked against. Read-only on the card.

    python serving_job.py --port PORT --log requests.jsonl --start-file go &
    wattlab record --nvml 0 --scrape http://127.0.0.1:PORT/metrics -o shared.h5 -- \
        sh -c 'touch go; until [ -e requests.jsonl ]; do sleep 0.2; done'
    wattlab record --nvml 0 -o exclusive.h5 -- python serving_job.py --exclusive ...
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import wattlab

MODEL = "gpt2-random"
ADMIT_AT_ONCE = 4
ADMIT_WAIT_S = 0.25
DEVICE = "cuda"  # --device cpu: a smoke test of the script on a machine without a GPU


@dataclass
class Request:
    id: str
    arrive_s: float  # after the server's start
    prompt_tokens: int
    output_tokens: int
    start_unix_s: float = 0.0
    first_token_unix_s: float | None = None
    end_unix_s: float = 0.0
    made: int = 0

    def log_line(self) -> str:
        return json.dumps({"id": self.id, "start_unix_s": self.start_unix_s,
                           "first_token_unix_s": self.first_token_unix_s,
                           "end_unix_s": self.end_unix_s,
                           "prompt_tokens": self.prompt_tokens,
                           "output_tokens": self.output_tokens})


@dataclass
class Counters:
    """vLLM's metric names, served as Prometheus text."""

    prompt: int = 0
    generated: int = 0
    finished: int = 0
    running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def text(self) -> str:
        label = f'{{model_name="{MODEL}"}}'
        with self.lock:
            return (f"# TYPE vllm:prompt_tokens_total counter\n"
                    f"vllm:prompt_tokens_total{label} {self.prompt}\n"
                    f"# TYPE vllm:generation_tokens_total counter\n"
                    f"vllm:generation_tokens_total{label} {self.generated}\n"
                    f"# TYPE vllm:request_success_total counter\n"
                    f"vllm:request_success_total{label} {self.finished}\n"
                    f"# TYPE vllm:num_requests_running gauge\n"
                    f"vllm:num_requests_running{label} {self.running}\n")


def serve_metrics(counters: Counters, port: int) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = counters.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def requests(n: int, rate_hz: float, seed: int, prompt: tuple[int, int],
             output: tuple[int, int]) -> list[Request]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate_hz)
        out.append(Request(f"r{i:04d}", t, rng.randint(*prompt), rng.randint(*output)))
    return out


def token_range(text: str) -> tuple[int, int]:
    """``MIN:MAX`` tokens, 1 <= MIN <= MAX."""
    lo, _, hi = text.partition(":")
    low, high = int(lo), int(hi or lo)
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: want MIN:MAX with 1 <= MIN <= MAX")
    return low, high


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class Cohort:
    """Requests admitted together: one batched prefill, then one decode step at a time."""

    def __init__(self, model: GPT2LMHeadModel, members: list[Request], vocab: int) -> None:
        self.members = members
        longest = max(r.prompt_tokens for r in members)
        ids = torch.randint(0, vocab, (len(members), longest), device=DEVICE)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(members):
            mask[row, longest - r.prompt_tokens:] = 1
        self.mask = mask
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        self.past = out.past_key_values
        self.next = out.logits[:, -1].argmax(-1, keepdim=True)

    def step(self, model: GPT2LMHeadModel) -> None:
        self.mask = torch.cat([self.mask, torch.ones_like(self.next)], dim=1)
        with torch.no_grad():
            out = model(input_ids=self.next, attention_mask=self.mask, past_key_values=self.past,
                        use_cache=True)
        self.past = out.past_key_values
        self.next = out.logits[:, -1].argmax(-1, keepdim=True)

    @property
    def done(self) -> bool:
        return all(r.made >= r.output_tokens for r in self.members)


def run_shared(model: GPT2LMHeadModel, todo: list[Request], cap: int, counters: Counters,
               vocab: int) -> None:
    start = time.monotonic()
    waiting, cohorts = list(todo), []
    while waiting or cohorts:
        now = time.monotonic() - start
        in_flight = sum(1 for c in cohorts for r in c.members if r.made < r.output_tokens)
        arrived = [r for r in waiting if r.arrive_s <= now][:max(0, cap - in_flight)]
        # a cohort waits for ADMIT_AT_ONCE arrivals or ADMIT_WAIT_S, as a batching server
        # does: admitted one by one, every request would run its own forward each step
        if arrived and len(arrived) < ADMIT_AT_ONCE and now - arrived[0].arrive_s < ADMIT_WAIT_S:
            arrived = []
        if arrived:
            for r in arrived:
                waiting.remove(r)
                r.start_unix_s = time.time()
            cohorts.append(Cohort(model, arrived, vocab))
            sync()
            t = time.time()
            for r in arrived:
                r.first_token_unix_s, r.made = t, 1
            with counters.lock:
                counters.prompt += sum(r.prompt_tokens for r in arrived)
                counters.generated += len(arrived)
                counters.running += len(arrived)
        elif not cohorts:
            time.sleep(0.005)
            continue
        for c in cohorts:
            c.step(model)
        sync()
        t = time.time()
        for c in cohorts:
            for r in c.members:
                if r.made < r.output_tokens:
                    r.made += 1
                    with counters.lock:
                        counters.generated += 1
                    if r.made == r.output_tokens:
                        r.end_unix_s = t
                        with counters.lock:
                            counters.finished += 1
                            counters.running -= 1
        cohorts = [c for c in cohorts if not c.done]


def run_exclusive(model: GPT2LMHeadModel, todo: list[Request], counters: Counters,
                  vocab: int) -> None:
    for r in todo:
        sync()
        with wattlab.phase("request", id=r.id):
            r.start_unix_s = time.time()
            cohort = Cohort(model, [r], vocab)
            sync()
            r.first_token_unix_s, r.made = time.time(), 1
            while r.made < r.output_tokens:
                cohort.step(model)
                r.made += 1
            sync()
            r.end_unix_s = time.time()
        with counters.lock:
            counters.prompt += r.prompt_tokens
            counters.generated += r.output_tokens
            counters.finished += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True, help="the per-request JSONL log to write")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rate-hz", type=float, default=8.0)
    parser.add_argument("--cap", type=int, default=16, help="requests in flight at most")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--exclusive", action="store_true")
    parser.add_argument("--idle-s", type=float, default=2.0, help="idle before and after")
    parser.add_argument("--start-file", help="serve the counters at once, but the requests "
                        "only once this file exists: a server already up when the recording "
                        "(and its scraper) starts, as with a real server and a load generator")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--embd", type=int, default=4096, help="the model's width")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                        help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--prompt-tokens", type=token_range, default=(128, 1024),
                        metavar="MIN:MAX")
    parser.add_argument("--output-tokens", type=token_range, default=(16, 48),
                        metavar="MIN:MAX")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.manual_seed(args.seed)
    config = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads,
                        n_positions=args.prompt_tokens[1] + args.output_tokens[1])
    dtype = getattr(torch, args.dtype or ("bfloat16" if DEVICE == "cuda" else "float32"))
    with torch.device(DEVICE):  # built where it runs: no 19 GB of fp32 on the host first
        model = GPT2LMHeadModel(config).to(dtype).eval()
    print(f"model: {args.layers} layers x {args.embd} wide, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, {dtype}",
          flush=True)
    counters = Counters()
    server = serve_metrics(counters, args.port)
    todo = requests(args.requests, args.rate_hz, args.seed, args.prompt_tokens,
                    args.output_tokens)
    Cohort(model, todo[:4], config.vocab_size)  # warm-up: kernels chosen before timing
    sync()
    while args.start_file and not os.path.exists(args.start_file):
        time.sleep(0.05)
    time.sleep(args.idle_s)
    if args.exclusive:
        run_exclusive(model, todo, counters, config.vocab_size)
    else:
        run_shared(model, todo, args.cap, counters, config.vocab_size)
    time.sleep(args.idle_s)
    with open(args.log + ".part", "w") as f:
        f.writelines(r.log_line() + "\n" for r in todo)
    os.replace(args.log + ".part", args.log)  # whole when it appears: the load waits on it
    print(f"served {len(todo)} requests, {counters.generated} tokens", flush=True)
    if args.start_file:  # a server outlives its load: it serves until it is killed
        threading.Event().wait()
    server.shutdown()


if __name__ == "__main__":
    main()
