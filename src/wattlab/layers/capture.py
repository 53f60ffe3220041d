"""Capture, on a real GPU, what per-layer time and energy inside real steps need (read only).

Three captures of one training step, written to a folder as ``NAME_*`` files (`load`
reads them back, so the analysis runs offline too):

- ``NAME_profile.json.gz``: the PyTorch profiler's trace of ``HOOKED_STEPS`` steps with a
  ``wl:LABEL:PASS`` range around every leaf module's forward and backward (boundary hooks)
  and a ``wl:step`` range per step: which kernels belong to which layer (kernel_trace.py).
- ``NAME_plain_profile.json.gz``: the trace of ``PLAIN_STEPS`` steps with no hooks and no
  ranges (GPU activities only): the step's own GPU idle time, which the hooks' host cost
  would inflate.
- ``NAME_plain.npz``: plain steps (no hooks, no profiler) back to back for ``seconds``,
  a CUDA event at each step's start anchored to unix time, NVML's 50 Hz power samples
  drained meanwhile and the energy counter at both ends (equivalent_time.py).

``NAME_profile_meta.json`` holds the plain step time without any profiler (the time the
rows must add up to) and the unix time the profiling began. Nothing on the GPU is set.
"""

from __future__ import annotations

import gzip
import json
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wattlab.errors import UsageError

HOOKED_STEPS = 10
PLAIN_STEPS = 12
WARMUP = 5
PLAIN_SECONDS = 15.0  # plain steps whose samples are folded: ~750 samples at 50 Hz
Step = Callable[[], Any]


@dataclass
class PlainRun:
    """Plain steps with NVML's samples: step starts (unix s, one more than steps), samples."""

    step_start_unix_s: np.ndarray
    sample_unix_s: np.ndarray
    sample_power_w: np.ndarray
    counter_j: tuple[float, float]


def step_time_s(step: Step, n: int) -> float:
    """Mean wall time of ``n`` steps back to back, the GPU drained at both ends."""
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


def _export(prof: Any, path: Path) -> None:
    plain = path.with_suffix("")  # NAME.json.gz -> NAME.json
    prof.export_chrome_trace(str(plain))
    with open(plain, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()


def profile_hooked(model: Any, step: Step, path: Path, steps: int = HOOKED_STEPS) -> float:
    """Profile ``steps`` steps with the layer ranges and a ``wl:step`` range each."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    def one() -> None:
        with record_function("wl:step"):
            step()
    with ranged(model):
        step_time_s(one, 2)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            s = step_time_s(one, steps)
    _export(prof, path)
    torch.cuda.empty_cache()
    return s


def profile_plain(step: Step, path: Path, steps: int = PLAIN_STEPS) -> float:
    """Profile ``steps`` plain steps, GPU activities only (the step's own idle gaps)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        s = step_time_s(step, steps)
    _export(prof, path)
    return s


def plain_run(step: Step, driver: Any, gpu: int, seconds: float) -> PlainRun:
    """Plain steps for ``seconds`` with a CUDA event per step start and NVML's samples."""
    import torch

    stamps: list[np.ndarray] = []
    powers: list[np.ndarray] = []
    stop = threading.Event()

    def drain() -> None:
        last = 0
        while not stop.is_set():
            t, p = driver.read_samples(gpu, last)
            if t.size:
                last = int(t[-1])
                stamps.append(t)
                powers.append(p)
            stop.wait(0.4)

    reader = threading.Thread(target=drain, name="wattlab-layer-samples", daemon=True)
    reader.start()
    time.sleep(1.0)
    torch.cuda.synchronize()
    anchor = torch.cuda.Event(enable_timing=True)
    anchor.record()
    anchor_unix_s = time.time()
    e0 = driver.read_energy_j(gpu)
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
    e1 = driver.read_energy_j(gpu)
    time.sleep(1.0)  # the samples of the last steps reach the buffer ~25 ms late
    stop.set()
    reader.join()
    starts = np.array([anchor.elapsed_time(ev) / 1e3 for ev in [*events, last]]) + anchor_unix_s
    return PlainRun(starts, np.concatenate(stamps) / 1e6, np.concatenate(powers), (e0, e1))


def capture(model: Any, x: Any, out: Path, name: str, *, gpu: int = 0,
            seconds: float = PLAIN_SECONDS, train: bool = True, driver: Any = None
            ) -> dict[str, float]:
    """All three captures of ``model``'s step (training or forward) on ``x``, under ``out``."""
    import torch

    from wattlab.drivers.nvml import NvmlDriver
    from wattlab.layers.torch_backend import step_job

    torch.cuda.set_device(gpu)
    out.mkdir(parents=True, exist_ok=True)
    step = step_job(model, x, train)
    step_time_s(step, WARMUP)
    plain_s = step_time_s(step, 30)
    unix_ns = time.time_ns()
    hooked_s = profile_hooked(model, step, out / f"{name}_profile.json.gz")
    plain_profiled_s = profile_plain(step, out / f"{name}_plain_profile.json.gz")
    (out / f"{name}_profile_meta.json").write_text(json.dumps(
        {"unix_ns_before_profile": unix_ns, "steps": HOOKED_STEPS, "plain_s": plain_s}))
    driver = driver or NvmlDriver()
    driver.open()
    try:
        run = plain_run(step, driver, gpu, seconds)
    finally:
        driver.close()
    np.savez_compressed(out / f"{name}_plain.npz", step_start_unix_s=run.step_start_unix_s,
                        sample_unix_us=run.sample_unix_s * 1e6,
                        sample_power_w=run.sample_power_w, counter_j=np.array(run.counter_j))
    return {"plain_ms": 1e3 * plain_s, "profiled_ms": 1e3 * hooked_s,
            "plain_profiled_ms": 1e3 * plain_profiled_s}


@dataclass
class Captured:
    """One case's captures, read back: trace paths, the plain step time and the plain run."""

    hooked_trace: Path
    plain_trace: Path | None
    plain_step_s: float
    run: PlainRun


def load(folder: str | Path, name: str) -> Captured:
    """Read one case's captures (``NAME_*`` files in ``folder``); the plain trace is optional."""
    d = Path(folder)
    meta_path, npz_path = d / f"{name}_profile_meta.json", d / f"{name}_plain.npz"
    for p in (d / f"{name}_profile.json.gz", meta_path, npz_path):
        if not p.is_file():
            raise UsageError(f"{p}: missing: capture {name} first (wattlab.layers.capture)")
    try:
        meta = json.loads(meta_path.read_text())
        z = np.load(npz_path)
        run = PlainRun(np.asarray(z["step_start_unix_s"], float),
                       np.asarray(z["sample_unix_us"], float) / 1e6,
                       np.asarray(z["sample_power_w"], float),
                       (float(z["counter_j"][0]), float(z["counter_j"][1])))
        plain_s = float(meta["plain_s"])
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"{d}/{name}_*: unreadable capture ({e!r})") from e
    plain = d / f"{name}_plain_profile.json.gz"
    return Captured(d / f"{name}_profile.json.gz", plain if plain.is_file() else None,
                    plain_s, run)
