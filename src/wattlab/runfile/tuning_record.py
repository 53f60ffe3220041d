"""The tuning record in a run file: ``/analysis/tuning``, written once the run has ended.

Why a record and not only a log line: a tuner that changes a GPU's settings must be
auditable afterwards — every setting measured, every iteration counted or not, every
model fitted and every decision, on the run's own timebase beside the streams.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from wattlab.errors import RunFileError
from wattlab.runfile.h5_read import open_read_only
from wattlab.tuning.search import Search

if TYPE_CHECKING:
    from wattlab.tuning.online import Controller


def write_tuning(path: str, search: Search, controller: Controller,
                 summary: dict[str, Any]) -> None:
    """``/analysis/tuning``: probes, iterations, setting changes, models and decisions.

    Times (ns) are on the run's session timebase, like every stream and marker.
    """
    knobs = search.knobs
    probes = [search.probes[i] for i in search.order]
    try:
        with h5py.File(path, "r+", locking=False) as f:
            g = f.require_group("analysis").create_group("tuning")
            g.attrs["summary_json"] = json.dumps(summary)
            g.attrs["models_json"] = json.dumps(search.models)
            g.attrs["decisions_json"] = json.dumps(search.decisions)
            g.attrs["iteration_source"] = summary["iteration_source"]
            g.attrs["knobs"] = json.dumps(knobs)
            p = g.create_group("probes")
            stats = np.array([pr.stats() for pr in probes]).reshape(-1, 4)
            for k in knobs:
                p[k] = np.array([pr.setting[k] for pr in probes])
            for j, name in enumerate(("energy_j", "energy_se_j", "time_s", "time_se_s")):
                p[name] = stats[:, j]
            p["iterations"] = np.array([len(pr.energy_j) for pr in probes], dtype=np.int64)
            p["purpose"] = np.array([pr.purpose for pr in probes], dtype=h5py.string_dtype())
            its = controller.iterations
            t0 = int(f.attrs.get("session_start_monotonic_ns", 0))  # times as in the run
            i = g.create_group("iterations")
            i["start_ns"] = np.array([it.start_ns - t0 for it, _, _ in its], dtype=np.int64)
            i["end_ns"] = np.array([it.end_ns - t0 for it, _, _ in its], dtype=np.int64)
            i["energy_j"] = np.array([it.energy_j for it, _, _ in its], dtype=np.float64)
            i["probe"] = np.array([p for _, p, _ in its], dtype=np.int64)
            i["used"] = np.array([u for _, _, u in its], dtype=bool)
            g.attrs["changes_json"] = json.dumps([{**c, "t_ns": c["t_ns"] - t0}
                                                  for c in controller.changes])
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
