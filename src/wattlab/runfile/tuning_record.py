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

from wattlab.errors import RunFileError
from wattlab.runfile.h5_read import open_read_only


@dataclass
class TuningRecord:
    """What a tune run leaves: times in ``*_ns`` on the host's monotonic clock.

    ``probes`` holds one array per knob and per figure (``energy_j``, ``energy_se_j``,
    ``time_s``, ``time_se_s``, ``iterations``, ``purpose``); ``iterations`` the arrays
    ``start_ns``, ``end_ns``, ``energy_j``, ``probe``, ``used``; ``changes`` one dict per
    setting change with its ``t_ns``.
    """

    summary: dict[str, Any]
    models: Any
    decisions: Any
    knobs: list[str]
    probes: dict[str, npt.NDArray[Any]]
    iterations: dict[str, npt.NDArray[Any]]
    changes: list[dict[str, Any]]


def write_tuning(path: str, record: TuningRecord) -> None:
    """``/analysis/tuning``: probes, iterations, setting changes, models and decisions.

    Times (ns) are shifted onto the run's session timebase, like every stream and marker.
    """
    try:
        with h5py.File(path, "r+", locking=False) as f:
            g = f.require_group("analysis").create_group("tuning")
            g.attrs["summary_json"] = json.dumps(record.summary)
            g.attrs["models_json"] = json.dumps(record.models)
            g.attrs["decisions_json"] = json.dumps(record.decisions)
            g.attrs["iteration_source"] = record.summary["iteration_source"]
            g.attrs["knobs"] = json.dumps(record.knobs)
            p = g.create_group("probes")
            for name, values in record.probes.items():
                p[name] = (np.array(values, dtype=h5py.string_dtype()) if name == "purpose"
                           else values)
            t0 = int(f.attrs.get("session_start_monotonic_ns", 0))  # times as in the run
            i = g.create_group("iterations")
            for name, values in record.iterations.items():
                i[name] = values - t0 if name.endswith("_ns") else values
            g.attrs["changes_json"] = json.dumps([{**c, "t_ns": c["t_ns"] - t0}
                                                  for c in record.changes])
    except (OSError, ValueError) as e:
        raise RunFileError(f"{path}: cannot add /analysis/tuning: {e}") from e


def read_tuning(path: str) -> dict[str, Any] | None:
    """The tuning record of a run file (None if it has none), for the report."""
    with open_read_only(path) as f:  # a crash-left or live file too
        g = f.get("analysis/tuning")
        if g is None:
            return None
        probes = {k: np.asarray(v[()]) for k, v in g["probes"].items()}
        probes["purpose"] = np.array([s.decode() if isinstance(s, bytes) else s
                                      for s in probes["purpose"]])
        return {"summary": json.loads(g.attrs["summary_json"]),
                "models": json.loads(g.attrs["models_json"]),
                "probes": probes, "knobs": json.loads(g.attrs["knobs"])}
