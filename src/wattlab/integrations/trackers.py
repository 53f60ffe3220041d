"""Per-phase energy into the experiment trackers users already read: MLflow, W&B, TensorBoard.

Why after the recording and not at each phase end: the energy of a phase is only known once
its streams have reached the run file (the counter is read every few seconds, rows land
every 0.5 s), so a number logged at a phase's end would be partial. Instead the workload
*announces* its tracker (a ``tracker`` marker, sent by the framework callbacks or by
``announce_trackers``), and when the recording ends ``wattlab record`` logs the finished
per-phase energy into that tracker's run; ``wattlab log RUN --to ...`` does the same for
any run file later.

Metrics (``energy_metrics``): ``energy/total_j`` (every joule the node report counts:
GPUs, CPU, DRAM, each once), ``energy/<part>_j`` (``gpu0``, ``amd0``, ``cpu``, ...), and
for each phase name ``energy/<name>_j`` and ``energy/<name>_s`` at step = the phase's
index (epoch 0, 1, 2...). The trackers are optional extras, imported only when used.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from wattlab.errors import UsageError
from wattlab.integrations import PhaseEmitter
from wattlab.runfile import SESSION_START_UNIX_NS

TRACKER_MARKER = "tracker"
TRACKERS = ("mlflow", "wandb", "tensorboard")
INSTALL = {"mlflow": "pip install mlflow-skinny (or mlflow)", "wandb": "pip install wandb",
           "tensorboard": "pip install tensorboard (or: pip install 'wattlab[trackers]')"}


@dataclass(frozen=True)
class Metric:
    """One number for a tracker: name, value, step and when (unix ms)."""

    name: str
    value: float
    step: int
    t_unix_ms: int


def _clean(name: str) -> str:
    """A phase name as every tracker accepts it in a metric name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "phase"


def energy_metrics(run: Any) -> list[Metric]:
    """The run's per-phase and per-part energy, from wattlab's own analysis of the file.

    A phase's energy adds the streams the node report counts (each joule once); where the
    run has none of those (a meter alone), the stream the energy report chose for it. A
    phase some counted stream has no number for is left out, never logged as a partial sum.
    """
    from wattlab.analysis.energy import energy_report, node_report

    nodes = node_report(run)
    report = energy_report(run, by_marker=True)
    start_ms = int(run.attrs.get(SESSION_START_UNIX_NS, time.time_ns())) // 1_000_000
    counted = {s for n in nodes["nodes"] for p in n["parts"] if p["added"]
               for s in p["streams"]}
    chosen = {c["phase"]: c for c in report["chosen"]}
    per_phase: dict[str, list[float | None]] = {}
    for row in report["rows"]:
        if f"{row['source']}:{row['channel']}" in counted:
            per_phase.setdefault(row["phase"], []).append(row["energy_j"])
    out: list[Metric] = []
    for phase in report["phases"]:
        at_ms = start_ms + round(phase["t1_s"] * 1e3)
        if counted:
            got = per_phase.get(phase["label"], [])
            energy_j = sum(got) if got and None not in got else None  # type: ignore[arg-type]
        else:
            energy_j = (chosen.get(phase["label"]) or {}).get("energy_j")
        if energy_j is None:
            continue
        name = "total" if phase["name"] == "run" else _clean(phase["name"])
        out.append(Metric(f"energy/{name}_j", float(energy_j), phase["index"], at_ms))
        out.append(Metric(f"energy/{name}_s", float(phase["t1_s"] - phase["t0_s"]),
                          phase["index"], at_ms))
    end_ms = start_ms + round(nodes["span_s"][1] * 1e3)
    out += [Metric(f"energy/{_clean(p['part'])}_j", float(p["energy_j"]), 0, end_ms)
            for n in nodes["nodes"] for p in n["parts"]
            if p["energy_j"] is not None and p["part"] != "wall" and len(nodes["nodes"]) == 1]
    return out


def _need(module: str) -> Any:
    """Import a tracker's package, or say how to install it (exit 2)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        tracker = module.partition(".")[0]
        raise UsageError(f"{tracker} is not installed: {INSTALL[tracker]}") from e


# --------------------------------------------------------------------------- writers


def log_mlflow(metrics: Iterable[Metric], run_id: str | None = None,
               tracking_uri: str | None = None) -> str:
    """Log into an MLflow run (the given id, else the active run); returns the run id."""
    mlflow = _need("mlflow")
    from mlflow.entities import Metric as MlflowMetric
    from mlflow.tracking import MlflowClient

    from wattlab.integrations.mlflow_store import opened

    if run_id is None:
        active = mlflow.active_run()
        if active is None:
            raise UsageError("MLflow: no active run; give --run-id (the run to add energy to)")
        run_id = active.info.run_id
    uri = tracking_uri or mlflow.get_tracking_uri()
    with opened(uri, run_id):
        client = MlflowClient(tracking_uri=uri)
        client.log_batch(run_id, metrics=[MlflowMetric(m.name, m.value, m.t_unix_ms, m.step)
                                          for m in metrics])
    return str(run_id)


def log_wandb(metrics: Iterable[Metric], run_id: str | None = None,
              project: str | None = None, directory: str | None = None) -> str:
    """Log into a W&B run: the active ``wandb.run``, else run ``run_id`` resumed.

    Each phase name gets its own step axis (``energy/<name>_index``), so epochs are plotted
    by epoch whatever the run's own step is; totals also go to the run's summary.
    """
    wandb = _need("wandb")
    run = wandb.run
    own = run is None
    if own:
        if run_id is None:
            raise UsageError("W&B: no active run; give --run-id (and --project)")
        run = wandb.init(id=run_id, project=project, dir=directory, resume="allow")
    try:
        for m in metrics:
            axis = m.name.rsplit("_", 1)[0] + "_index"
            run.define_metric(m.name, step_metric=axis)
            run.log({m.name: m.value, axis: m.step})
            if m.step == 0:
                run.summary[m.name] = m.value
        return str(run.id)
    finally:
        if own:
            run.finish()


def log_tensorboard(metrics: Iterable[Metric], target: Any) -> str:
    """Scalars into TensorBoard: ``target`` is a writer with ``add_scalar`` or a log folder.

    A folder gets a new event file of its own (TensorBoard reads every file in it), written
    with the ``tensorboard`` package alone, no torch needed.
    """
    if hasattr(target, "add_scalar"):
        for m in metrics:
            target.add_scalar(m.name, m.value, global_step=m.step, walltime=m.t_unix_ms / 1e3)
        flush = getattr(target, "flush", None)
        if flush is not None:
            flush()
        return str(getattr(target, "log_dir", "") or getattr(target, "logdir", "") or "writer")
    _need("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder = os.fspath(target)
    writer = EventFileWriter(folder, filename_suffix=".wattlab")
    try:
        for m in metrics:
            writer.add_event(Event(wall_time=m.t_unix_ms / 1e3, step=m.step, summary=Summary(
                value=[Summary.Value(tag=m.name, simple_value=m.value)])))
    finally:
        writer.close()
    return folder


# --------------------------------------------------------------------------- announcements


def _active_trackers() -> list[dict[str, Any]]:
    """The trackers this process has a run open in (only packages already imported)."""
    found: list[dict[str, Any]] = []
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None and (run := mlflow.active_run()) is not None:
        found.append({"tracker": "mlflow", "run_id": run.info.run_id,
                      "tracking_uri": mlflow.get_tracking_uri()})
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        found.append({"tracker": "wandb", "run_id": wandb.run.id, "project": wandb.run.project,
                      "dir": os.path.dirname(os.path.dirname(wandb.run.dir))})
    return found


def announce_trackers(tensorboard_dir: str | os.PathLike[str] | None = None, *,
                      emitter: PhaseEmitter | None = None,
                      extra: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Tell the recording which tracker runs this workload uses (a marker per tracker).

    MLflow's active run and ``wandb.run`` are found by themselves; TensorBoard's folder
    must be given (a ``SummaryWriter``'s ``log_dir``); ``extra`` adds runs a framework
    names (Lightning's loggers). Outside a session the markers go nowhere.
    """
    found = _active_trackers() + list(extra)
    if tensorboard_dir is not None:
        found.append({"tracker": "tensorboard", "dir": os.path.abspath(tensorboard_dir)})
    unique: list[dict[str, Any]] = []
    for payload in found:
        if payload not in unique:
            unique.append(payload)
            (emitter or PhaseEmitter()).point(TRACKER_MARKER, **payload)
    return unique


def lightning_targets(loggers: Iterable[Any]) -> list[dict[str, Any]]:
    """The tracker runs of Lightning's loggers (TensorBoard's folder, MLflow's run)."""
    out: list[dict[str, Any]] = []
    for logger in loggers:
        kind = type(logger).__name__.lower()
        if "tensorboard" in kind and getattr(logger, "log_dir", None):
            out.append({"tracker": "tensorboard", "dir": os.path.abspath(logger.log_dir)})
        elif "mlflow" in kind and getattr(logger, "run_id", None):
            out.append({"tracker": "mlflow", "run_id": logger.run_id,
                        "tracking_uri": getattr(logger, "_tracking_uri", None)})
    return out


def announced(run: Any) -> list[dict[str, Any]]:
    """The tracker runs a recording's workload announced, each once."""
    seen: list[dict[str, Any]] = []
    for m in run.markers:
        if m.name == TRACKER_MARKER and m.payload.get("tracker") in TRACKERS \
                and m.payload not in seen:
            seen.append(dict(m.payload))
    return seen


def log_to(tracker: str, metrics: list[Metric], *, run_id: str | None = None,
           tracking_uri: str | None = None, project: str | None = None,
           directory: str | None = None) -> str:
    """Log to one tracker by name; returns where it went (run id or folder)."""
    if tracker == "mlflow":
        return log_mlflow(metrics, run_id, tracking_uri)
    if tracker == "wandb":
        return log_wandb(metrics, run_id, project, directory)
    if tracker == "tensorboard":
        if directory is None:
            raise UsageError("TensorBoard: give the log folder (--dir)")
        return log_tensorboard(metrics, directory)
    raise UsageError(f"unknown tracker {tracker!r}; known: {', '.join(TRACKERS)}")


def log_announced(path: str) -> list[str]:
    """After a recording: log its energy into every tracker its workload announced."""
    import wattlab

    with wattlab.open(path) as run:
        targets = announced(run)
        if not targets:
            return []
        metrics = energy_metrics(run)
    lines = []
    for t in targets:
        where = log_to(t["tracker"], metrics, run_id=t.get("run_id"),
                       tracking_uri=t.get("tracking_uri"), project=t.get("project"),
                       directory=t.get("dir"))
        lines.append(f"{len(metrics)} energy metrics logged to {t['tracker']} ({where})")
    return lines
