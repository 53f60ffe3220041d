"""The tuning record in a run file: ``/analysis/tuning``, written once the run has ended.

Why a record and not only a log line: a tuner that changes a GPU's settings must be
auditable afterwards — every setting measured, every iteration counted or not, every
model fitted and every decision, on the run's own timebase beside the streams.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from wattlab.runfile import schema
from wattlab.runfile.h5_read import open_read_only
from wattlab.runfile.records import add_record


@dataclass
class TuningProbes:
    """One row per setting measured, in search order (``/analysis/tuning/probes``)."""

    settings: dict[str, npt.NDArray[Any]]  # per knob, its value at each probe
    energy_j: npt.NDArray[np.float64]  # mean energy per iteration
    energy_se_j: npt.NDArray[np.float64]
    time_s: npt.NDArray[np.float64]  # mean iteration time
    time_se_s: npt.NDArray[np.float64]
    iterations: npt.NDArray[np.int64]  # iterations measured
    purpose: npt.NDArray[Any]  # why it was measured (str)


@dataclass
class TuningIterations:
    """One row per iteration the tuner saw (``/analysis/tuning/iterations``)."""

    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    energy_j: npt.NDArray[np.float64]
    probe: npt.NDArray[np.int64]  # row of the probe in force
    used: npt.NDArray[np.bool_]  # counted for that probe


@dataclass
class TuningRecord:
    """What a tune run leaves.

    Times (``*_ns``, each change's ``t_ns``) are the host's monotonic clock in a record
    handed to ``write_tuning``, which stores them on the run's session timebase like every
    stream and marker; ``read_tuning`` gives them back as stored.
    """

    summary: dict[str, Any]
    models: list[dict[str, Any]]
    decisions: list[dict[str, Any]]
    knobs: list[str]
    probes: TuningProbes
    iterations: TuningIterations
    changes: list[dict[str, Any]]  # one per setting change, with its ``t_ns``


def write_tuning(path: str, record: TuningRecord) -> None:
    """``/analysis/tuning``: probes, iterations, setting changes, models and decisions."""
    def fill(g: h5py.Group) -> None:
        g.attrs[schema.SUMMARY_JSON] = json.dumps(record.summary)
        g.attrs[schema.MODELS_JSON] = json.dumps(record.models)
        g.attrs[schema.DECISIONS_JSON] = json.dumps(record.decisions)
        g.attrs[schema.ITERATION_SOURCE] = record.summary["iteration_source"]
        g.attrs[schema.KNOBS] = json.dumps(record.knobs)
        p = g.create_group(schema.PROBES)
        for knob, values in record.probes.settings.items():
            p[knob] = values
        for name in schema.PROBE_COLUMNS:
            column = getattr(record.probes, name)
            p[name] = (np.array(column, dtype=h5py.string_dtype()) if name == schema.PURPOSE
                       else column)
        t0 = int(g.file.attrs.get(schema.SESSION_START_MONOTONIC_NS, 0))  # times as in the run
        i = g.create_group(schema.ITERATIONS)
        for name in schema.ITERATION_COLUMNS:
            column = getattr(record.iterations, name)
            i[name] = column - t0 if name.endswith("_ns") else column
        g.attrs[schema.CHANGES_JSON] = json.dumps([{**c, "t_ns": c["t_ns"] - t0}
                                                   for c in record.changes])

    add_record(path, (schema.TUNING,), fill)


def read_tuning(path: str) -> TuningRecord | None:
    """The tuning record of a run file (None if it has none), times as stored."""
    with open_read_only(path) as f:  # a crash-left or live file too
        g = f.get(f"{schema.ANALYSIS}/{schema.TUNING}")
        if g is None:
            return None
        knobs = json.loads(g.attrs[schema.KNOBS])
        p, i = g[schema.PROBES], g[schema.ITERATIONS]
        columns = {name: np.asarray(p[name][()]) for name in schema.PROBE_COLUMNS}
        columns[schema.PURPOSE] = np.array([s.decode() if isinstance(s, bytes) else s
                                            for s in columns[schema.PURPOSE]])
        return TuningRecord(
            json.loads(g.attrs[schema.SUMMARY_JSON]), json.loads(g.attrs[schema.MODELS_JSON]),
            json.loads(g.attrs[schema.DECISIONS_JSON]), knobs,
            TuningProbes({k: np.asarray(p[k][()]) for k in knobs}, **columns),
            TuningIterations(**{name: np.asarray(i[name][()])
                                for name in schema.ITERATION_COLUMNS}),
            json.loads(g.attrs[schema.CHANGES_JSON]))
