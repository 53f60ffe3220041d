"""The sweep runner: one recorded run per setting and repeat, settings always restored.

Why a guard object: a sweep changes a GPU's power limit or locks its clocks, and the card
must never be left changed — not after an error, Ctrl-C or SIGTERM. ``SettingsGuard`` reads
the original first, checks every planned setting against the GPU's range *before* changing
anything, and restores in ``finally``; signals only set a flag (and stop the current run),
so the restore code is never interrupted by them.

Each run is a real ``Session`` (recorder process + the NVML acquirer) into its own run file,
whose root attributes say its setting; the results (runtime, energy per source, mean power,
clocks) go to one sweep file, rewritten atomically after every run. With the simulated GPU
there is no real workload, so a run is a fixed amount of work: it ends when the simulated
GPU has done ``sim_work_s`` seconds of full-clock work, so a lower clock takes longer.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wattlab.acquisition.acquirers import NvmlAcquirer
from wattlab.acquisition.session import Session, SessionResult
from wattlab.drivers.nvml import NO_LIBRARY_MESSAGE, NvmlDriver
from wattlab.errors import NvmlError, UsageError
from wattlab.runfile import SWEEP_SETTING_JSON

# (run file, GPU, runtime s or None) -> (runtime s, energy J per source, mean state)
Measure = Callable[[str, int, "float | None"], tuple[float, dict[str, float], dict[str, float]]]
# (rows so far, file attributes) -> None: persist the results after every run
Save = Callable[[list["RunResult"], dict[str, Any]], None]

X_NAMES = {"power_limit": "power_limit_w", "sm_clock": "sm_clock_mhz", "mem_clock": "mem_clock_mhz"}
KNOB_LABELS = {"power_limit": ("power limit", "W"), "sm_clock": ("SM clock", "MHz"),
               "mem_clock": ("memory clock", "MHz")}
SIM_LIMIT_FACTOR = 20.0  # a simulated run may take this many times its full-speed time
# Keep recording after the work ends (simulated or a command), so every stream covers the
# window: the energy counter's value lags its read by up to a tick, a lag that cancels only
# between reads in step with its ticks, so the window's end needs such a read after it.
SIM_TAIL_S = 0.3

# Sweep runs are short: read the energy counter at its own 10 Hz update rate (not the
# reader's 9 s default) so the counter's energy of each run's window is exact; 100 ms,
# not the reader's 90 ms grid: reads that walk against the counter's ticks put a short
# window off by up to a tick. A read whose jitter crosses a tick pins the tick grid, and
# the analysis then puts every read at its tick (analysis/energy/counter_ticks.py).
SWEEP_ENERGY_S = 0.1
# A run can be shorter than the reader's 0.9 s state cadence: read clocks, utilisation and
# the limit on every 90 ms power poll, so each run's window has its measured settings.
SWEEP_STATE_S = 0.09


MAX_SETTINGS = 1000  # each is a recorded run: more is a typo in the step


def parse_settings(spec: str, knob: str) -> list[float]:
    """``"150:300:25"`` (start:stop:step, stop included) or ``"150,200,250"``."""
    label, unit = KNOB_LABELS[knob]
    text = spec.strip()
    try:
        if ":" in text:
            parts = [float(p) for p in text.split(":")]
            if len(parts) != 3 or not all(map(math.isfinite, parts)) or parts[2] <= 0 \
                    or parts[1] < parts[0]:
                raise ValueError("need finite start:stop:step with step > 0 and stop >= start")
            start, stop, step = parts
            count = math.floor((stop - start) / step + 1e-9) + 1
            if count > MAX_SETTINGS:
                raise ValueError(f"{count} settings, more than {MAX_SETTINGS}")
            values = [start + i * step for i in range(count)]
        else:
            values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError as e:
        raise UsageError(f"{label} list {spec!r} is not valid ({e}); use e.g. 150:300:25 "
                         f"or 150,200,250 ({unit})") from e
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise UsageError(f"{label} list {spec!r} must hold positive numbers ({unit})")
    return list(dict.fromkeys(values))


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep will do: which knob, which settings, how often, on which GPU."""

    knob: str
    settings: list[float]
    repeat: int = 1
    gpu: int = 0
    command: list[str] | None = None
    sim_work_s: float = 2.0
    on_failure: str = "continue"

    @property
    def x_name(self) -> str:
        return X_NAMES[self.knob]

    def runs(self) -> list[tuple[float, int]]:
        """(setting, repeat) in the order they run: each setting's repeats together."""
        return [(x, r) for x in self.settings for r in range(self.repeat)]

    def describe(self, device: str, original: str) -> list[str]:
        """The plan as lines, for ``--dry-run`` and the log."""
        label, unit = KNOB_LABELS[self.knob]
        what = " ".join(self.command) if self.command else (
            f"simulated fixed work ({self.sim_work_s:g} s at full clock)")
        lines = [f"sweep of the {label} on GPU {self.gpu} ({device}), now {original}",
                 f"workload: {what}",
                 f"{len(self.settings)} settings x {self.repeat} repeat(s) = "
                 f"{len(self.runs())} runs:"]
        lines += [f"  {i + 1:3d}. {label} {x:g} {unit}, repeat {r + 1}/{self.repeat}"
                  for i, (x, r) in enumerate(self.runs())]
        lines.append(f"then the original {label} is restored")
        return lines


def _nearest(allowed: list[int], value: float) -> int:
    return min(allowed, key=lambda c: abs(c - value))


class SettingsGuard:
    """Applies settings to one GPU and restores the original, exactly once, on any exit."""

    def __init__(self, driver: NvmlDriver, gpu: int, knob: str) -> None:
        self.driver = driver
        self.gpu = gpu
        self.knob = knob
        self.info = driver.device_info(gpu)
        self.original_power_limit_w = driver.get_power_limit_w(gpu)
        self.changed = False
        self.restored: dict[str, Any] = {}

    def describe_original(self) -> str:
        if self.knob == "power_limit":
            return f"power limit {self.original_power_limit_w:g} W"
        if self.knob == "mem_clock":
            return "memory clock unlocked (restored by resetting the lock)"
        return "SM clock unlocked (restored by resetting the lock)"

    def check(self, settings: list[float]) -> None:
        """Every setting must be one the GPU accepts; checked before anything changes."""
        gpu = self.gpu
        if self.knob == "power_limit":
            lo, hi = self.info.power_limit_min_w, self.info.power_limit_max_w
            if lo is None or hi is None:
                raise UsageError(f"GPU {gpu}: its power limit range is unknown "
                                 f"({self.info.missing.get('power_limit_range', '')})")
            bad = [x for x in settings if not lo <= x <= hi]
            if bad:
                raise UsageError(f"GPU {gpu}: power limit(s) {', '.join(f'{b:g}' for b in bad)} "
                                 f"W outside its range {lo:g}-{hi:g} W")
        else:
            what = "memory" if self.knob == "mem_clock" else "SM"
            allowed = (self.info.mem_clocks_mhz if self.knob == "mem_clock"
                       else self.info.sm_clocks_mhz)
            if not allowed:
                raise UsageError(f"GPU {gpu}: it lists no supported {what} clocks")
            bad = [x for x in settings if int(x) != x or int(x) not in allowed]
            if bad:
                near = [_nearest(allowed, b) for b in bad]
                raise UsageError(
                    f"GPU {gpu}: {what} clock(s) {', '.join(f'{b:g}' for b in bad)} MHz not "
                    f"supported (nearest: {', '.join(map(str, near))} MHz; range "
                    f"{min(allowed)}-{max(allowed)} MHz)")

    def apply(self, x: float) -> None:
        self.changed = True  # before the call: a half-applied setting is restored too
        if self.knob == "power_limit":
            self.driver.set_power_limit_w(self.gpu, x)
        elif self.knob == "mem_clock":
            self.driver.lock_memory_clocks(self.gpu, int(x), int(x))
        else:
            self.driver.lock_sm_clocks(self.gpu, int(x), int(x))

    def restore(self) -> dict[str, Any]:
        """Put the original back and read it back; a no-op when nothing was changed."""
        if not self.changed or self.restored:
            return self.restored
        if self.knob == "power_limit":
            self.driver.set_power_limit_w(self.gpu, self.original_power_limit_w)
            self.restored = {"power_limit_w": self.driver.get_power_limit_w(self.gpu)}
        elif self.knob == "mem_clock":
            self.driver.reset_memory_clocks(self.gpu)
            self.restored = {"mem_clocks": "reset"}
        else:
            self.driver.reset_clocks(self.gpu)
            self.restored = {"sm_clocks": "reset"}
        self.changed = False
        return self.restored


@dataclass
class _SweepSession(Session):
    """A Session whose signal-driven stop also stops the sweep; finishing work does not."""

    sweep_stop: threading.Event = field(default_factory=threading.Event)

    def request_stop(self) -> None:
        """Ctrl-C / SIGTERM during a run: end this run and the sweep."""
        self.sweep_stop.set()
        super().request_stop()

    def finish_work(self) -> None:
        """The simulated work is done: end this run only."""
        super().request_stop()


class _SimulatedWork:
    """Ends a run once the simulated GPU has done a fixed amount of work."""

    def __init__(self, gpu: Any, work_s: float) -> None:
        self.gpu = gpu
        self.work_s = work_s
        self.begin_ns: int | None = None
        self.finish_ns: int | None = None
        self._checked_ns = 0

    def check(self, session: _SweepSession, elapsed_s: float) -> None:
        now = time.monotonic_ns()
        if self.begin_ns is None:
            self.begin_ns = now - round(elapsed_s * 1e9)
            self._checked_ns = self.begin_ns
            self.gpu.hold_history_from(self.begin_ns)  # the run's work and energy, however long
        if self.finish_ns is None and self.gpu.work_done(self.begin_ns, now) >= self.work_s:
            lo, hi = self._checked_ns, now  # the work rate is piecewise constant: bisect
            while hi - lo > 100_000:
                mid = (lo + hi) // 2
                if self.gpu.work_done(self.begin_ns, mid) >= self.work_s:
                    hi = mid
                else:
                    lo = mid
            self.finish_ns = hi
        if self.finish_ns is not None and now >= self.finish_ns + round(SIM_TAIL_S * 1e9):
            session.finish_work()
        self._checked_ns = now


@dataclass
class RunResult:
    """One row of the sweep."""

    x: float
    repeat: int
    status: str
    runtime_s: float
    energies_j: dict[str, float]
    sm_clock_mhz: float
    mem_clock_mhz: float
    power_limit_w: float
    run_file: str
    exit_code: int | None


@dataclass
class SweepOutcome:
    """What the sweep did: rows, whether it finished, what was restored."""

    plan: SweepPlan
    rows: list[RunResult]
    complete: bool
    interrupted: bool
    restored: dict[str, Any]
    output: str


@contextmanager
def _stop_on_signals(stop: threading.Event,
                     current: Callable[[], _SweepSession | None]) -> Iterator[None]:
    """SIGINT/SIGTERM between runs: set the flag (the restore runs in ``finally``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        stop.set()
        session = current()
        if session is not None:
            session.request_stop()

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def open_driver(simulate: bool, gpu: int, seed: int = 0, sim_utilisation: float = 1.0,
                schedule: Any = None) -> tuple[NvmlDriver, Any, str]:
    """(open driver, simulated GPU or None, note): NVML, or the simulated GPU.

    The simulated GPU is used when asked, or when this machine has no NVIDIA driver; it
    runs ``schedule`` (a WorkloadSchedule) if given, else a steady ``sim_utilisation``.
    """
    note = ""
    if not simulate:
        driver = NvmlDriver()
        try:
            driver.open()
            return driver, None, note
        except NvmlError as e:
            if not str(e).startswith(NO_LIBRARY_MESSAGE):
                raise
            note = "no NVIDIA driver found: running against the simulated GPU"
    from wattlab.device_models import Segment, WorkloadSchedule
    from wattlab.hardware.fake_nvml import FakeNvml
    from wattlab.hardware.simulated_gpu import SimulatedGpu

    if not 0.0 < sim_utilisation <= 1.0:
        raise UsageError(f"simulated utilisation must be within (0, 1], got {sim_utilisation}")
    if schedule is None:
        schedule = WorkloadSchedule([Segment(3600.0, sim_utilisation, "sweep")], repeat=True)
    gpus = [SimulatedGpu(index=i, seed=seed + i, schedule=schedule) for i in range(gpu + 1)]
    driver = NvmlDriver(FakeNvml(gpus))
    driver.open()
    return driver, gpus[gpu], note


def runs_folder(output: str) -> Path:
    """Where the per-run files go: ``sweep.h5`` → ``sweep.runs/``."""
    p = Path(output)
    return p.with_name(p.stem + ".runs")


def run_sweep(plan: SweepPlan, driver: NvmlDriver, output: str, *, measure: Measure,
              save: Save, sim_gpu: Any = None,
              log: Callable[[str], None] = print) -> SweepOutcome:
    """Run the plan; the original setting is restored on any exit before this returns.

    One run file per run goes under ``runs_folder(output)``; ``measure`` reads each run's
    figures, ``save`` persists all rows after each run (error, Ctrl-C and SIGTERM included).
    """
    if os.path.exists(output):
        raise UsageError(f"{output}: already exists; wattlab never overwrites a results file")
    if plan.command is None and sim_gpu is None:
        raise UsageError("sweep needs a command after '--' (or --simulate)")
    driver.resolve_gpus(str(plan.gpu))
    guard = SettingsGuard(driver, plan.gpu, plan.knob)
    guard.check(plan.settings)
    folder = runs_folder(output)
    folder.mkdir(exist_ok=True)
    stop = threading.Event()
    current: list[_SweepSession | None] = [None]
    rows: list[RunResult] = []
    sources: list[str] = []
    label, unit = KNOB_LABELS[plan.knob]
    todo = plan.runs()
    started = time.monotonic()
    attrs: dict[str, Any] = {"command": plan.command or [], "gpu": plan.gpu, "knob": plan.knob,
                             "simulated": sim_gpu is not None, "complete": False,
                             "interrupted": False, "original_json": guard.describe_original(),
                             "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        with _stop_on_signals(stop, lambda: current[0]):
            for i, (x, rep) in enumerate(todo):
                if stop.is_set():
                    break
                guard.apply(x)
                row = _one_run(plan, driver, folder, x, rep, sim_gpu=sim_gpu, stop=stop,
                               current=current, measure=measure)
                rows.append(row)
                sources += [s for s in row.energies_j if s not in sources]
                save(rows, attrs)
                elapsed = time.monotonic() - started
                left = elapsed / (i + 1) * (len(todo) - i - 1)
                energy = row.energies_j.get(sources[0], float("nan")) if sources else math.nan
                log(f"[{i + 1}/{len(todo)}] {label} {x:g} {unit}, repeat {rep + 1}: "
                    f"{row.status}, {row.runtime_s:.3f} s, {energy:.1f} J, "
                    f"elapsed {elapsed:.0f} s, about {left:.0f} s left")
                if row.status == "failed" and plan.on_failure == "stop":
                    log(f"the workload failed at {label} {x:g} {unit}: stopping "
                        "(--on-failure stop)")
                    break
    finally:
        restored = guard.restore()
    complete = len(rows) == len(todo) and not stop.is_set()
    attrs.update(complete=complete, interrupted=stop.is_set(),
                 restored_json=json.dumps(restored))
    save(rows, attrs)
    return SweepOutcome(plan, rows, complete, stop.is_set(), restored, output)


def _one_run(plan: SweepPlan, driver: NvmlDriver, folder: Path, x: float, rep: int, *,
             sim_gpu: Any, stop: threading.Event,
             current: list[_SweepSession | None], measure: Measure) -> RunResult:
    path = str(folder / f"{plan.x_name}-{x:g}-r{rep}.h5")
    # a fixed amount of simulated work ends a run only where there is no command: a command's
    # run ends with the command (ended by the work, a slow start was killed as "failed")
    work = (_SimulatedWork(sim_gpu, plan.sim_work_s)
            if sim_gpu is not None and plan.command is None else None)
    setting = {"knob": plan.knob, "x_name": plan.x_name, "x": x, "repeat": rep, "gpu": plan.gpu}
    acquirer = NvmlAcquirer(driver, plan.gpu, intervals_s={"energy": SWEEP_ENERGY_S,
                                                         "state": SWEEP_STATE_S})
    session = _SweepSession(
        path, [(f"gpu{plan.gpu}", acquirer)], command=plan.command,
        duration_s=None if plan.command else plan.sim_work_s * SIM_LIMIT_FACTOR + 5.0,
        tail_s=SIM_TAIL_S if plan.command else 0.0,
        root_attrs={SWEEP_SETTING_JSON: json.dumps(setting)},
        on_progress=None if work is None else (lambda s: work.check(session, s)),
        sweep_stop=stop)
    current[0] = session
    try:
        result: SessionResult = session.run()
    finally:
        current[0] = None
    runtime: float | None = None
    true_j: float | None = None
    if work is not None:
        if work.finish_ns is not None and work.begin_ns is not None:
            runtime = (work.finish_ns - work.begin_ns) / 1e9
            true_j = float(sim_gpu.true_energy_j(work.begin_ns, work.finish_ns))
        sim_gpu.hold_history_from(None)  # the run is over: its past may go
        if runtime is None:
            return RunResult(x, rep, "interrupted", math.nan, {}, math.nan, math.nan, math.nan,
                             path, None)
    status = "ok"
    code = result.command_exit_code
    if result.interrupted and (work is None or work.finish_ns is None):
        status = "interrupted"
    elif code not in (None, 0):
        status = "failed"
    runtime_s, energies, state = measure(path, plan.gpu, runtime)
    if true_j is not None:
        energies["true"] = true_j
    return RunResult(x, rep, status, runtime_s, energies, state.get("sm_clock_mhz", math.nan),
                     state.get("mem_clock_mhz", math.nan), state.get("power_limit_w", math.nan),
                     path, code)
