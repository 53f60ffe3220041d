"""What `record --scrape` costs: the scraper's CPU at 10 Hz, against a server in another process.

    python bench/scrape_cost.py               # 30 s per page (~1 min)
    python bench/scrape_cost.py --quick       # 5 s per page (CI-sized)
    python bench/scrape_cost.py --recording   # whole recordings instead (~1.5 min)

The endpoint runs in a child process (its CPU is the server's, not the recording's), serving
either the simulated server's page (9 lines) or a page the size of a real vLLM's (its
counters among some 800 lines of histograms, gauges and process metrics). Here the scraper
polls it as a source runner would, at 10 Hz with its real sleep, for ``--duration`` s; its
CPU is this process's CPU clock over that time (nothing else runs here), as % of one core
(goal <= 0.1 %), beside the CPU per scrape. A baseline row polls nothing at the same rate
(the same sleep, no scrape): what waking 10 times a second costs this machine alone. A
last row is the floor of any Python scraper here: a fresh interpreter that only sends a GET
on a kept socket and reads the answer's bytes, at the same rate.

``--recording`` measures what the scraper alone leaves out: a whole ``wattlab record --nvml
none --scrape URL`` of each page (session, recorder, the scraper's runner: each batch of
rows it sends is a bus message and recorder work), its process tree's CPU clocks over
``--duration`` s from ``RECORD_FROM_S`` after its start (the imports and set-up stay out).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from common import tree_cpu_s, write_json
from wattlab.acquisition.acquirers.acquirer import Chunk, sleep_until_due
from wattlab.acquisition.acquirers.scrape import ScrapeAcquirer
from wattlab.acquisition.acquirers.scrape.scrape_acquirer import check_url
from wattlab.hardware.simulated_server import demo_server

HZ = 10.0
GOAL_CORE_PCT = 0.1
RECORD_FROM_S = 10.0  # after a recording's start: imports and set-up are done
RECORD_UNTIL_S = 3.0  # before its planned end: the stop and the closing summary stay out
SERVER = """
import sys, time
from wattlab.hardware.metrics_endpoint import MetricsEndpoint
page = sys.stdin.read()
with MetricsEndpoint(lambda: page) as endpoint:
    print(endpoint.url, flush=True)
    time.sleep(3600)
"""


def vllm_sized_page(counters: str) -> str:
    """The counters among the other metrics a real vLLM serves: ~800 lines in all."""
    lines = [counters.rstrip("\n")]
    buckets = [0.001 * 2 ** k for k in range(20)] + [float("inf")]
    for h in range(24):
        name = f"vllm:histogram_{h}_seconds"
        lines += [f"# HELP {name} A latency histogram.", f"# TYPE {name} histogram"]
        for le in buckets:
            edge = "+Inf" if le == float("inf") else f"{le:g}"
            lines.append(f'{name}_bucket{{le="{edge}",model_name="simulated-llm"}} {h * 7.0}')
        lines += [f'{name}_count{{model_name="simulated-llm"}} 7.0',
                  f'{name}_sum{{model_name="simulated-llm"}} 1.25']
    for g in range(120):
        lines += [f"# TYPE process_metric_{g} gauge", f"process_metric_{g} {g * 1.5}"]
    return "\n".join(lines) + "\n"


ROUND_TRIP = """
import socket, sys, time
host, port, path, hz, duration_s, size = sys.argv[1:]
sock = socket.create_connection((host, int(port)))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
request = f"GET {path} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode()
step, n = 1 / float(hz), 0
wall0, cpu0 = time.monotonic(), time.process_time()
while time.monotonic() - wall0 < float(duration_s):
    time.sleep(step)
    sock.send(request)
    got = 0
    while got < int(size):
        got += len(sock.recv(65536))
    n += 1
print(n, time.monotonic() - wall0, time.process_time() - cpu0)
"""


@contextmanager
def endpoint(page: str) -> Iterator[str]:
    """``page`` served by another process (its CPU is not ours); its URL."""
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(page)
        server.stdin.close()
        yield server.stdout.readline().strip()
    finally:
        server.kill()
        server.wait()


def row(page: str, scrapes: int, wall_s: float, cpu_s: float) -> dict[str, float]:
    return {"lines": page.count("\n"), "bytes": len(page), "scrapes": scrapes,
            "rate_hz": scrapes / wall_s, "cpu_us_per_scrape": 1e6 * cpu_s / max(scrapes, 1),
            "core_pct": 100 * cpu_s / wall_s}


def measure(page: str, duration_s: float) -> dict[str, float]:
    with endpoint(page) as url:
        acq = ScrapeAcquirer(url, hz=HZ)
        acq.open()
        rows = 0
        wall0, cpu0 = time.monotonic(), time.process_time()
        while time.monotonic() - wall0 < duration_s:
            rows += sum(len(r.t_host_ns) for r in acq.poll() if isinstance(r, Chunk))
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        # the rows still held for their batch (the flush's own last scrape not counted)
        rows += sum(len(r.t_host_ns) for r in acq.flush() if isinstance(r, Chunk)) - 1
        acq.close()
    return row(page, rows, wall, cpu)


def round_trip(page: str, duration_s: float) -> dict[str, float]:
    """The same 10 Hz wake-ups, each a bare GET on a kept socket read to the page's end and
    nothing else, in a fresh interpreter (no numpy, no wattlab): the floor under any
    scraper of this page in Python on this machine."""
    with endpoint(page) as url:
        _, host, port, path = check_url(url)
        out = subprocess.run([sys.executable, "-c", ROUND_TRIP, host, str(port), path,
                              str(HZ), str(duration_s), str(len(page.encode()))],
                             capture_output=True, text=True, check=True).stdout.split()
    return row(page, int(out[0]), float(out[1]), float(out[2]))


def baseline(duration_s: float) -> dict[str, float]:
    """The same 10 Hz wake-ups with nothing read: the floor under any poller here."""
    step_ns = round(1e9 / HZ)
    due, wakes = time.monotonic_ns() + step_ns, 0
    wall0, cpu0 = time.monotonic(), time.process_time()
    while time.monotonic() - wall0 < duration_s:
        if sleep_until_due(due, 0.1):
            due += step_ns
            wakes += 1
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    return row("", wakes, wall, cpu)


def recording(page: str, duration_s: float) -> dict[str, float]:
    """A whole ``record --nvml none --scrape`` of ``page``: its process tree's steady CPU."""
    with endpoint(page) as url, tempfile.TemporaryDirectory() as folder:
        total_s = RECORD_FROM_S + duration_s + RECORD_UNTIL_S
        proc = subprocess.Popen([sys.executable, "-m", "wattlab.cli", "record", "--nvml", "none",
                                 "--scrape", url, "--duration", str(total_s), "-o",
                                 f"{folder}/r.h5", "--no-live"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started, marks = time.monotonic(), []
        for at_s in (RECORD_FROM_S, RECORD_FROM_S + duration_s):
            time.sleep(max(0.0, started + at_s - time.monotonic()))
            marks.append((time.monotonic(), tree_cpu_s(proc.pid)))
        if proc.wait() != 0:
            raise SystemExit(f"the recording failed: {proc.args}")
    (wall0, cpu0), (wall1, cpu1) = marks
    return {"lines": page.count("\n"), "bytes": len(page), "measured_s": wall1 - wall0,
            "core_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0)}


def recordings(pages: dict[str, str], duration_s: float, quick: bool) -> None:
    results = {name: recording(page, duration_s) for name, page in pages.items()}
    print(f"whole `record --nvml none --scrape` at {HZ:g} Hz, process tree, "
          f"{duration_s:g} s from {RECORD_FROM_S:g} s after the start:")
    for name, r in results.items():
        print(f"{name:21} {r['lines']:6d} lines {r['core_pct']:7.3f} % of a core")
    write_json("scrape_cost_recording", {"hz": HZ, "duration_s": duration_s, "quick": quick,
                                         "pages": results})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--quick", action="store_true", help="5 s per page")
    ap.add_argument("--recording", action="store_true",
                    help="whole recordings (session, recorder, runner) instead")
    args = ap.parse_args()
    duration_s = 5.0 if args.quick else args.duration
    counters = demo_server(0).exposition()
    pages = {"simulated server": counters, "vLLM-sized": vllm_sized_page(counters)}
    if args.recording:
        recordings(pages, duration_s, args.quick)
        return
    results = {"baseline (no scrape)": baseline(duration_s)}
    results |= {name: measure(page, duration_s) for name, page in pages.items()}
    results["bare GET, simulated page"] = round_trip(counters, duration_s)
    print(f"scraper CPU at {HZ:g} Hz over {duration_s:g} s (server in another process):")
    floor = results["baseline (no scrape)"]["core_pct"]
    print(f"{'page':21} {'lines':>6} {'bytes':>7} {'rate Hz':>8} {'us/scrape':>10} "
          f"{'% core':>7} {'above baseline':>15}")
    for name, r in results.items():
        print(f"{name:21} {r['lines']:6d} {r['bytes']:7d} {r['rate_hz']:8.2f} "
              f"{r['cpu_us_per_scrape']:10.0f} {r['core_pct']:7.3f} "
              f"{r['core_pct'] - floor:15.3f}")
    worst = max(r["core_pct"] for name, r in results.items() if name in pages)
    print(f"goal <= {GOAL_CORE_PCT:g} % of a core: "
          f"{'met' if worst <= GOAL_CORE_PCT else 'NOT met'} (worst {worst:.3f} %, "
          f"{worst - floor:.3f} % above waking at {HZ:g} Hz)")
    write_json("scrape_cost", {"hz": HZ, "duration_s": duration_s, "quick": args.quick,
                               "pages": results, "goal_core_pct": GOAL_CORE_PCT,
                               "worst_core_pct": worst, "baseline_core_pct": floor})


if __name__ == "__main__":
    main()
