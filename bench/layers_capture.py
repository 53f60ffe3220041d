"""Capture what per-layer energy inside real steps needs, on a real GPU (read only).

For each case (model, batch), two captures written to ``OUT`` (default results/):

- ``NAME_profile.json.gz``: the PyTorch profiler's trace (CUPTI kernel records) of a few
  training steps with a ``wl:LABEL:PASS`` range around every leaf module's forward and
  backward, pushed by boundary hooks; plus the host's unix time when the profiler started.
- ``NAME_plain.npz``: plain training steps (no hooks, no profiler) back to back for
  ``--seconds``, one CUDA event per step start, anchored to unix time; NVML's 50 Hz power
  samples (unix µs, W) drained meanwhile; the energy counter at both ends.

It also prints the step time plain, with the hooks' ranges, and with the hooks under the
profiler: what the instrumentation costs the step.

    PYTHONPATH=src python3 bench/layers_capture.py [--out DIR] [--seconds 20]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

CASES = (("resnet50", 32), ("resnet50", 128), ("vgg16", 16), ("vgg16", 64))


def step_time_s(step: Any, n: int) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def ranged(model: Any) -> Any:
    """Boundary hooks that open and close a profiler range per leaf module and pass."""
    import torch

    from wattlab.integrations.layer_hooks import hook_leaves

    open_ranges: dict[tuple[str, str, int], Any] = {}

    def on(label: str, pass_name: str, edge: str, call: int) -> None:
        key = (label, pass_name, call)
        if edge == "begin":
            open_ranges[key] = torch.ops.profiler._record_function_enter_new(
                f"wl:{label}:{pass_name}", None)
        elif key in open_ranges:
            torch.ops.profiler._record_function_exit._RecordFunction(open_ranges.pop(key))
    return hook_leaves(model, on)


def capture(name: str, batch: int, out: Path, seconds: float) -> dict[str, Any]:
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from wattlab.drivers.nvml import NvmlDriver
    from wattlab.layers.model_spec import load_model
    from wattlab.layers.torch_backend import step_job

    model = load_model(name).cuda().train()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    step = step_job(model, x, True)
    for _ in range(5):
        step()
    plain_s = step_time_s(step, 30)
    with ranged(model):
        hooked_s = step_time_s(step, 30)
        unix_ns = time.time_ns()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            profiled_s = step_time_s(step, 10)
    trace = out / f"{name}{batch}_profile.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()
    (out / f"{name}{batch}_profile_meta.json").write_text(json.dumps(
        {"unix_ns_before_profile": unix_ns, "steps": 10, "plain_s": plain_s}))

    driver = NvmlDriver()
    driver.open()
    stamps: list[Any] = []
    powers: list[Any] = []
    stop = threading.Event()

    def drain() -> None:
        last = 0
        while not stop.is_set():
            t, p = driver.read_samples(0, last)
            if t.size:
                last = int(t[-1])
                stamps.append(t)
                powers.append(p)
            stop.wait(0.4)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    time.sleep(1.0)
    torch.cuda.synchronize()
    anchor = torch.cuda.Event(enable_timing=True)
    anchor.record()
    anchor_unix_s = time.time()
    e0 = driver.read_energy_j(0)
    e0_unix_s = time.time()
    events = []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        events.append(ev)
        step()
        if len(events) % 20 == 0:
            events[-10].synchronize()  # keep the host at most ~10 steps ahead
    last = torch.cuda.Event(enable_timing=True)
    last.record()
    last.synchronize()
    e1 = driver.read_energy_j(0)
    e1_unix_s = time.time()
    time.sleep(1.0)
    stop.set()
    reader.join()
    driver.close()
    starts = np.array([anchor.elapsed_time(ev) / 1e3 for ev in [*events, last]]) + anchor_unix_s
    np.savez_compressed(out / f"{name}{batch}_plain.npz", step_start_unix_s=starts,
                        sample_unix_us=np.concatenate(stamps),
                        sample_power_w=np.concatenate(powers),
                        counter_j=np.array([e0, e1]), counter_unix_s=np.array([e0_unix_s,
                                                                                e1_unix_s]))
    del model
    torch.cuda.empty_cache()
    return {"case": f"{name} b{batch}", "plain_ms": 1e3 * plain_s, "hooked_ms": 1e3 * hooked_s,
            "profiled_ms": 1e3 * profiled_s, "plain_steps": len(events),
            "plain_step_ms": 1e3 * (starts[-1] - starts[0]) / len(events),
            "plain_step_j": (e1 - e0) / len(events)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, batch in CASES:
        row = capture(name, batch, out, args.seconds)
        print(row, flush=True)
        rows.append(row)
    (out / "layers_capture.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
