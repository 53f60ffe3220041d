"""A real generation server for the per-request and per-token energy checks (real GPU only).

No model can be downloaded on the lent machine: a decoder-only transformer with random
weights (serving_model.py) is built on the GPU, in bf16. Its default size (8 layers of width
8192: ~6.7 B parameters, ~13 GB) makes each decode step ~3 ms of reading weights behind ~1 ms
of Python, so the GPU sets the pace; every request in flight is decoded by one forward a
step (continuous batching), each arrival prefilled into a free slot of one KV cache.

Requests arrive staggered (seeded Poisson arrivals, prompt and output lengths drawn per
request) and are admitted while fewer than ``--cap`` are in flight. The server exposes vLLM's
metric names on its own Prometheus endpoint and writes the per-request JSONL log of
docs/serving.md, its times the GPU's (each step's end read from a CUDA event).

``--exclusive`` serves the same requests one at a time, each marked ``request`` with the
GPU synchronised at both edges: the per-request truth the shared run's attribution is
checked against (bench/serving_shares.py). Read-only on the card.

    python serving_job.py --port PORT --log requests.jsonl --start-file go [--exclusive] &
    wattlab record --nvml 0 --scrape http://127.0.0.1:PORT/metrics -o run.h5 -- \
        sh -c 'echo "$WATTLAB_BUS" > go; until [ -e requests.jsonl ]; do sleep 0.2; done'

(bench/device_serving_floor.sh runs both.)
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from serving_model import SlotModel

import wattlab

MODEL = "decoder-random"
QUEUED_STEPS = 2  # steps the host queues ahead of the GPU: enough to keep it busy
DEVICE = "cuda"  # --device cpu: a smoke test of the script on a machine without a GPU


@dataclass
class Request:
    id: str
    arrive_s: float  # after the server's start
    prompt_tokens: int
    output_tokens: int
    start_unix_s: float = 0.0
    scheduled_unix_s: float = 0.0  # its prefill's start on the GPU
    first_token_unix_s: float | None = None
    end_unix_s: float = 0.0
    made: int = 0  # tokens the GPU has made
    cached: int = 0  # tokens in its slot once the steps queued so far have run

    def log_line(self) -> str:
        return json.dumps({"id": self.id, "start_unix_s": self.start_unix_s,
                           "scheduled_unix_s": self.scheduled_unix_s,
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


class Server:
    """Continuous batching: each arrival prefilled into a free slot, then every slot in flight
    decoded by one forward a step. The host queues steps ahead and learns when each ended
    from a CUDA event, so the requests' times in the log are the GPU's, to the event."""

    def __init__(self, model: SlotModel, cap: int, counters: Counters) -> None:
        self.model, self.cap, self.counters = model, cap, counters
        self.active: dict[int, Request] = {}  # slot -> request still to be decoded
        # per point queued on the GPU: its event, the requests it ends a token of, and those
        # whose prefill it starts
        self.pending: deque[tuple[torch.cuda.Event | None, list[Request], list[Request]]] = (
            deque())
        self.most_in_flight = 0

    def _queue(self, made: list[Request], starts: list[Request] | None = None) -> None:
        """The work just queued makes a token for each of ``made``, or what is queued next
        starts the prefill of ``starts``; settle what ended."""
        event = None
        if DEVICE == "cuda":
            event = torch.cuda.Event()
            event.record()
        self.pending.append((event, made, starts or []))
        while len(self.pending) > QUEUED_STEPS:
            self._settle()

    def _settle(self) -> None:
        event, made, starts = self.pending.popleft()
        if event is not None:
            event.synchronize()
        t = time.time()
        for r in starts:
            r.scheduled_unix_s = t
        with self.counters.lock:
            for r in made:
                r.made += 1
                self.counters.generated += 1
                if r.made == 1:
                    r.first_token_unix_s = t
                    self.counters.prompt += r.prompt_tokens
                    self.counters.running += 1
                if r.made == r.output_tokens:
                    r.end_unix_s = t
                    self.counters.finished += 1
                    self.counters.running -= 1

    def admit(self, r: Request) -> None:
        slot = min(set(range(self.cap)) - set(self.active))
        self._queue([], [r])
        self.model.prefill(slot, r.prompt_tokens)
        if r.output_tokens > 1:
            self.active[slot] = r
            r.cached = r.prompt_tokens
        self._queue([r])

    def step(self) -> None:
        """One decode step of every request in flight; a request done frees its slot."""
        batch = max(self.active) + 1
        longest = max(r.cached for r in self.active.values()) + 1
        self.model.decode(batch, longest)
        made = list(self.active.values())
        for slot, r in list(self.active.items()):
            r.cached += 1
            if r.cached - r.prompt_tokens == r.output_tokens - 1:
                del self.active[slot]
        self._queue(made)

    def serve(self, todo: list[Request]) -> None:
        """``todo`` as it arrives (``arrive_s`` after now), at most ``cap`` in flight."""
        start, start_unix = time.monotonic(), time.time()
        waiting = deque(sorted(todo, key=lambda r: r.arrive_s))
        while waiting or self.active:
            now = time.monotonic() - start
            while waiting and waiting[0].arrive_s <= now and len(self.active) < self.cap:
                r = waiting.popleft()
                r.start_unix_s = start_unix + r.arrive_s  # its arrival: time queued counts
                self.admit(r)
            if self.active:
                self.most_in_flight = max(self.most_in_flight, len(self.active))
                self.step()
            else:  # nothing in flight: every step ends before the wait for the next arrival
                while self.pending:
                    self._settle()
                time.sleep(0.001)
        while self.pending:
            self._settle()


def warm_up(model: SlotModel, prompt_tokens: tuple[int, int], cap: int) -> None:
    """Every prompt length and every context length once, alone and in a full batch.

    The first forward of a new shape is slow (the library picks and builds its kernels:
    ~50 ms a prefill on the lent H200 with cuDNN's attention, ten times a steady decode
    step), which would charge the first requests of each run what the shapes cost.
    """
    for prompt in range(prompt_tokens[0], prompt_tokens[1] + 1):
        model.prefill(0, prompt)
    for longest in range(1, model.context + 1):
        for batch in (1, cap):
            model.decode(batch, longest)
    sync()


def run_exclusive(server: Server, todo: list[Request]) -> None:
    """One request at a time, each inside a ``request`` phase, the GPU idle at both edges."""
    for r in todo:
        sync()
        with wattlab.phase("request", id=r.id):
            r.arrive_s = 0.0
            server.serve([r])
            sync()


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
    parser.add_argument("--start-file", help="serve the counters once warm, but the requests "
                        "only once this file exists (it may hold the recording's marker bus, "
                        "$WATTLAB_BUS): a server already up when the recording (and its "
                        "scraper) starts, as with a real server and a load generator")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                        help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--prompt-tokens", type=token_range, default=(128, 512),
                        metavar="MIN:MAX")
    parser.add_argument("--output-tokens", type=token_range, default=(64, 256),
                        metavar="MIN:MAX")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype or ("bfloat16" if DEVICE == "cuda" else "float32"))
    model = SlotModel(layers=args.layers, width=args.width, heads=args.heads,
                      vocab=args.vocab, slots=args.cap, device=DEVICE, dtype=dtype,
                      context=args.prompt_tokens[1] + args.output_tokens[1])
    print(f"model: {args.layers} layers x {args.width} wide, {model.parameters / 1e9:.2f} B "
          f"parameters, {dtype}", flush=True)
    todo = requests(args.requests, args.rate_hz, args.seed, args.prompt_tokens,
                    args.output_tokens)
    t = time.monotonic()
    warm_up(model, args.prompt_tokens, args.cap)
    print(f"torch {torch.__version__}: warmed up in {time.monotonic() - t:.1f} s", flush=True)
    counters = Counters()
    server = serve_metrics(counters, args.port)  # up once warm: the load may start
    if args.start_file:
        while not os.path.exists(args.start_file):
            time.sleep(0.05)
        with open(args.start_file) as f:  # the recording's marker bus, where it gave one
            os.environ["WATTLAB_BUS"] = f.read().strip() or os.environ.get("WATTLAB_BUS", "")
    time.sleep(args.idle_s)
    serving = Server(model, args.cap, counters)
    if args.exclusive:
        run_exclusive(serving, todo)
    else:
        serving.serve(todo)
    time.sleep(args.idle_s)
    with open(args.log + ".part", "w") as f:
        f.writelines(r.log_line() + "\n" for r in todo)
    os.replace(args.log + ".part", args.log)  # whole when it appears: the load waits on it
    print(f"served {len(todo)} requests, {counters.generated} tokens; most in flight "
          f"{serving.most_in_flight}", flush=True)
    if args.start_file:  # a server outlives its load: it serves until it is killed
        threading.Event().wait()
    server.shutdown()


if __name__ == "__main__":
    main()
