"""The power stream attribution runs on: the one `wattlab energy` chooses for the run.

Why: per-unit and per-request figures must be the same joules `wattlab energy` reports,
with the same verdict (docs/validity.md). The run's chosen stream is used where it is a
power channel; where a counter (J) is chosen, the resolving power channel with the
shortest edge. Its verdict and failed checks travel with every figure made from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wattlab.analysis.attribution.core import FloatArray
from wattlab.analysis.energy import invalid_reasons
from wattlab.errors import UsageError
from wattlab.runfile import Run


@dataclass
class PowerStream:
    """A power channel's finite samples (session s, W), its edge time and its verdict."""

    name: str
    t_s: FloatArray
    power_w: FloatArray
    edge_s: float
    run_s: tuple[float, float]  # the span `energy` calls the run (every stream covers it)
    valid: bool
    invalid_reasons: list[str]
    energy_j: float | None = None  # `energy`'s figure for the run on this stream, and its ±
    energy_pm_j: float | None = None
    checks: dict[str, Any] = field(default_factory=dict)  # its named checks (docs/validity.md)

    def verdict_json(self) -> dict[str, Any]:
        return {"stream": self.name, "valid": self.valid,
                "invalid_reasons": self.invalid_reasons}


def run_power_stream(run: Run, report: dict[str, Any], device: str = "") -> PowerStream:
    """The run's power stream as ``energy_report``'s ``report`` chose it (module doc).

    ``device``: only that device's streams (``gpu0`` for ``gpu0.samples`` and the like,
    ``node1.gpu0`` for ``node1.gpu0.samples`` on a multi-node run).
    """
    rows = [r for r in report["rows"] if r["phase"] == "run" and r["method"] == "power"
            and r["energy_j"] is not None
            and (not device or r["source"].startswith(f"{device}."))]
    if not rows:
        raise UsageError(f"{run.path}: no power channel {'of ' + device + ' ' if device else ''}"
                         "to attribute energy from")
    chosen = next((c["stream"] for c in report["chosen"] if c["phase"] == "run"), None)
    pick = [r for r in rows if f"{r['source']}:{r['channel']}" == chosen] or sorted(
        rows, key=lambda r: (not r.get("resolves"), r.get("edge_s") or np.inf))
    row = pick[0]
    view = run.source(row["source"])
    t, p = view.time_s, np.asarray(view.channel(row["channel"]), dtype=np.float64)
    ok = np.isfinite(p) & np.isfinite(t)
    t, p = t[ok], p[ok]
    if t.size < 2 or np.any(np.diff(t) <= 0):
        raise UsageError(f"{run.path}: {row['source']}:{row['channel']} has too few samples or "
                         "times that do not increase: no attribution")
    return PowerStream(f"{row['source']}:{row['channel']}", t, p, float(row["edge_s"] or 0.0),
                       (float(row["t0_s"]), float(row["t1_s"])), bool(row["valid"]),
                       invalid_reasons(row), row["energy_j"], row["uncertainty_j"],
                       row.get("checks", {}))
