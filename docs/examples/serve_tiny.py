"""A tiny stand-in for a serving loop: staggered requests decoded in batches of 20 ms steps.

Each step counts the tokens it generated (``wattlab.count``); each request's start, first
token and end go to requests.jsonl in wattlab's request-log format (docs/serving.md).
"""

import json
import time

import wattlab

ARRIVALS_S = [0.0, 0.1, 0.15, 0.5, 0.55, 0.9]  # when each request arrives
OUTPUT_TOKENS = [30, 12, 25, 18, 40, 8]
STEP_S = 0.02  # one decode step: one token for every request in flight

time.sleep(1.5)  # idle before
t0 = time.time()
waiting = list(range(len(ARRIVALS_S)))
running: dict[int, int] = {}  # request -> tokens still to generate
log: dict[int, dict] = {}
with wattlab.phase("serve"):
    while waiting or running:
        now = time.time() - t0
        while waiting and ARRIVALS_S[waiting[0]] <= now:
            i = waiting.pop(0)
            log[i] = {"id": f"req{i}", "start_unix_s": time.time(), "prompt_tokens": 64,
                      "output_tokens": OUTPUT_TOKENS[i]}
            time.sleep(0.08)  # prefill: the prompt's pass, which gives the first token
            log[i]["first_token_unix_s"] = time.time()
            wattlab.count("tokens")
            running[i] = OUTPUT_TOKENS[i] - 1
        time.sleep(STEP_S)
        wattlab.count("tokens", len(running))
        for i in list(running):
            running[i] -= 1
            if running[i] <= 0:
                log[i]["end_unix_s"] = time.time()
                del running[i]
                wattlab.count("requests")
time.sleep(1.5)  # idle after
with open("requests.jsonl", "w") as f:
    for i in sorted(log):
        f.write(json.dumps(log[i]) + "\n")
