"""``wattlab tune``: a recording session whose controller tunes the GPU while the job trains.

Why inside a session: the user gets the same run file as ``wattlab record`` — every stream,
every marker — plus the tuning record. The GPU's 50 Hz power samples are tapped on their
way to the recorder (``SampleTap``) and fed to the online iteration detector; each finished
iteration goes to the search, and a setting it asks for is applied at once, with a marker
(``tune.setting``) in the run. Iterations that began before a change are not counted for
the new setting. The tap injects those markers with the samples, so the bus needs no
second publisher. Settings are restored by ``KnobGuards`` in ``finally`` (errors, Ctrl-C
and SIGTERM stop the session cleanly first) and, should this process be killed, by the
watchdog process.
"""

from __future__ import annotations

import json
import os
import queue
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from wattlab.acquisition.acquirers import Acquirer, Chunk, NvmlAcquirer, Reading
from wattlab.acquisition.session import Session, SessionResult
from wattlab.analysis.iterations import DetectedIteration, IterationStream
from wattlab.drivers.nvml import NvmlDriver
from wattlab.errors import NvmlError, UsageError
from wattlab.runfile import TUNE_JSON, TuningIterations, TuningProbes, TuningRecord, write_tuning
from wattlab.samples import Marker, SourceDescriptor
from wattlab.tuning import watchdog
from wattlab.tuning.guards import KnobGuards
from wattlab.tuning.marker_iterations import EnergyTrack, StepMarkers
from wattlab.tuning.search import Search, SearchConfig

# the tuner reacts to what the recorder gets: drain and emit the samples every 0.5 s
TUNE_INTERVALS_S = {"drain": 0.5, "emit": 0.5}
ITERATION_SOURCE = "power samples (IterationStream)"
# the detector's busy/idle levels must follow a setting change within a few iterations
STREAM_MEMORY_S = 5.0
# a setting at which no iteration is seen for this long (and 5 baseline periods) is abandoned
ABANDON_S = 4.0


class SampleTap:
    """An acquirer that passes another's readings on, copying its power samples to a queue.

    It also sends the markers the controller queues, with the next readings.
    """

    def __init__(self, inner: Acquirer, samples_id: str) -> None:
        self.inner = inner
        self.samples_id = samples_id
        self.samples: queue.SimpleQueue[tuple[np.ndarray, np.ndarray]] = queue.SimpleQueue()
        self.markers: queue.SimpleQueue[Marker] = queue.SimpleQueue()

    def open(self) -> list[SourceDescriptor]:
        return self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def wake(self) -> None:
        wake = getattr(self.inner, "wake", None)
        if wake is not None:
            wake()

    def poll(self) -> list[Reading]:
        return self._tap(self.inner.poll())

    def flush(self) -> list[Reading]:
        flush = getattr(self.inner, "flush", None)
        return self._tap(flush() if flush is not None else [])

    def _tap(self, readings: list[Reading]) -> list[Reading]:
        for r in readings:
            if isinstance(r, Chunk) and r.source_id == self.samples_id and len(r.t_host_ns):
                power = np.asarray(r.values, dtype=np.float64).reshape(len(r.t_host_ns), -1)
                self.samples.put((np.asarray(r.t_host_ns, np.int64), power[:, 0].copy()))
        out = list(readings)
        while not self.markers.empty():
            out.append(self.markers.get_nowait())
        return out


@dataclass
class TunePlan:
    """What to tune, how, on which GPU."""

    knobs: list[str]
    config: SearchConfig
    gpu: int = 0
    dry_run: bool = False
    command: list[str] | None = None
    duration_s: float | None = None
    min_period_s: float = 0.01
    max_period_s: float = 10.0
    step_marker: str | None = None  # iterations from this marker instead of the power
    auto_markers: bool = False  # framework callbacks in a Python workload (as in record)


@dataclass
class TuneOutcome:
    """The finished run: session result, what was decided, what was restored."""

    session: SessionResult
    summary: dict[str, Any]
    restored: dict[str, Any]
    dry_run: bool
    iterations: int
    log: list[str] = field(default_factory=list)


class Controller:
    """Called every progress tick: iterations in, settings out."""

    def __init__(self, plan: TunePlan, tap: SampleTap, search: Search,
                 guards: KnobGuards | None, output: str) -> None:
        self.plan = plan
        self.steps = None if plan.step_marker is None else StepMarkers(output, plan.step_marker)
        self.energy = EnergyTrack()
        self.source = (ITERATION_SOURCE if self.steps is None else
                       f"step markers '{plan.step_marker}' (energy from {tap.samples_id})")
        self.tap = tap
        self.search = search
        self.guards = guards
        self.stream = IterationStream(min_period_s=plan.min_period_s,
                                      max_period_s=plan.max_period_s,
                                      memory_s=STREAM_MEMORY_S)
        self.seen_ns = 0  # last iteration counted at the current setting
        self.would_apply: dict[str, float] | None = None  # dry run: the first change asked
        self.changed_ns = 0
        self.iterations: list[tuple[DetectedIteration, int, bool]] = []  # (it, probe, used)
        self.changes: list[dict[str, Any]] = []
        self.cpu_ns = 0  # CPU time spent in ticks
        self.period_s = 0.0  # the detector's median period, as of the last iteration

    def tick(self, _elapsed_s: float) -> None:
        """One progress tick; its CPU time is added up (the tuner's own cost, audited)."""
        begin_ns = time.thread_time_ns()
        try:
            self._tick()
        finally:
            self.cpu_ns += time.thread_time_ns() - begin_ns

    def _tick(self) -> None:
        while not self.tap.samples.empty():
            t_ns, power_w = self.tap.samples.get_nowait()
            if self.steps is not None:
                self.energy.push(t_ns, power_w)
                continue
            for it in self.stream.push(t_ns, power_w):
                self._iteration(it)
        if self.steps is not None:
            for it in self.steps.poll(self.energy):
                if it.period_s <= self.plan.max_period_s:  # a pause or an evaluation
                    self._iteration(it)
        quiet_s = (time.monotonic_ns() - max(self.changed_ns, self.seen_ns)) / 1e9
        if self.changed_ns and quiet_s > ABANDON_S + 5 * self.period_s:
            self._apply(self.search.abandon(f"no iteration detected for {quiet_s:.1f} s"))

    def _iteration(self, it: DetectedIteration) -> None:
        # the detector's median period changes only here: computing it at every 50 ms tick
        # cost ~0.7 % of a core on an H100 dry run (quartiles over every period kept)
        self.period_s = self.stream.state.median_period_s or 0.0
        probe = self.search.order.index(self.search.current)
        used = it.start_ns >= self.changed_ns
        self.iterations.append((it, probe, used))
        if not used or self.would_apply is not None:
            return  # it began at the previous setting, or a dry run has its baseline
        self.seen_ns = it.end_ns
        self._apply(self.search.observe(it.energy_j, it.period_s))

    def _apply(self, nxt: tuple[int, ...] | None) -> None:
        if nxt is None or self.would_apply is not None:
            return
        setting = self.search.setting(nxt)
        if self.guards is None:  # dry run: the default is measured; say what comes next
            self.would_apply = setting
            self.tap.markers.put(Marker(time.monotonic_ns(), "tune.would_apply", "point",
                                        "tune", dict(setting)))
            return
        purpose = self.search.reason
        if self.guards is not None:
            self.guards.apply(setting)
        self.changed_ns = time.monotonic_ns()
        self.changes.append({"t_ns": self.changed_ns, "purpose": purpose, **setting})
        self.tap.markers.put(Marker(self.changed_ns, "tune.setting", "point", "tune",
                                    {"purpose": purpose, "applied": self.guards is not None,
                                     **setting}))


def tune_axes(driver: NvmlDriver, plan: TunePlan) -> tuple[KnobGuards, dict[str, Any]]:
    """Guards for the plan's knobs and the axes to search (checked before any change)."""
    if not plan.knobs:
        raise UsageError("--knobs must name at least one of sm_clock, mem_clock, power_limit")
    driver.resolve_gpus(str(plan.gpu))
    guards = KnobGuards(driver, plan.gpu, plan.knobs)
    axes = guards.axes()
    for knob, values in axes.items():
        guards.guards[knob].check(list(values))
    return guards, axes


def may_change(driver: NvmlDriver, guards: KnobGuards) -> str | None:
    """None if settings may be changed here, else why not (then the tuner only measures).

    Writes the power limit in force back unchanged: the one way to ask NVML for permission.
    """
    guard = next(iter(guards.guards.values()))
    try:
        driver.set_power_limit_w(guard.gpu, guard.original_power_limit_w)
    except NvmlError as e:
        return str(e)
    return None


def run_tune(plan: TunePlan, driver: NvmlDriver, output: str, *, simulate: bool = False,
             watchdog_log: str | None = None) -> TuneOutcome:
    """Record the workload while tuning; every original is restored before this returns."""
    if plan.command is None and plan.duration_s is None:
        raise UsageError("tune needs a command after '--' (or --duration with --simulate)")
    guards, axes = tune_axes(driver, plan)
    search = Search(axes, plan.config)
    inner = NvmlAcquirer(driver, plan.gpu, intervals_s=TUNE_INTERVALS_S)
    tap = SampleTap(inner, f"gpu{plan.gpu}.samples")
    controller = Controller(plan, tap, search, None if plan.dry_run else guards, output)
    guard_proc = None if plan.dry_run else watchdog.start(guards.originals(),
                                                          simulate=simulate, log=watchdog_log)
    session = Session(output, [(f"gpu{plan.gpu}", tap)], command=plan.command,
                      duration_s=plan.duration_s, on_progress=controller.tick,
                      auto_markers=plan.auto_markers,
                      root_attrs={TUNE_JSON: json.dumps({"knobs": plan.knobs,
                                                         "dry_run": plan.dry_run,
                                                         **asdict(plan.config)})})
    restored: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    try:
        result = session.run()
    finally:
        if not plan.dry_run:
            restored = guards.restore()
            if guard_proc is not None:
                watchdog.release(guard_proc)
        # the record is written whatever ended the run: after an error it is the audit trail
        summary = search.summary() | {"iteration_source": controller.source,
                                      "dry_run": plan.dry_run, "restored": restored,
                                      "would_apply_next": controller.would_apply,
                                      "controller_cpu_s": controller.cpu_ns / 1e9}
        if os.path.exists(output):
            write_tuning(output, tuning_record(search, controller, summary))
    return TuneOutcome(result, summary, restored, plan.dry_run, len(controller.iterations))


def tuning_record(search: Search, controller: Controller,
                  summary: dict[str, Any]) -> TuningRecord:
    """The record of a finished tune: every probe in search order, every iteration."""
    probes = [search.probes[i] for i in search.order]
    stats = np.array([pr.stats() for pr in probes]).reshape(-1, 4)
    its = controller.iterations
    return TuningRecord(
        summary, search.models, search.decisions, list(search.knobs),
        TuningProbes({k: np.array([pr.setting[k] for pr in probes]) for k in search.knobs},
                     energy_j=stats[:, 0], energy_se_j=stats[:, 1], time_s=stats[:, 2],
                     time_se_s=stats[:, 3],
                     iterations=np.array([len(pr.energy_j) for pr in probes], dtype=np.int64),
                     purpose=np.array([pr.purpose for pr in probes], dtype=object)),
        TuningIterations(start_ns=np.array([it.start_ns for it, _, _ in its], dtype=np.int64),
                         end_ns=np.array([it.end_ns for it, _, _ in its], dtype=np.int64),
                         energy_j=np.array([it.energy_j for it, _, _ in its], dtype=np.float64),
                         probe=np.array([p for _, p, _ in its], dtype=np.int64),
                         used=np.array([u for _, _, u in its], dtype=bool)),
        list(controller.changes))

