"""What iteration detection reports, and the statistics every method shares.

Why one result for all methods: a user (and ``wattlab tune``) compares energy per
iteration across runs whether the steps came from markers, from power bursts or from an
autocorrelation period, so each method fills the same fields and says which it was.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import json_safe
from wattlab.analysis.iterations.iteration_stream import DetectedIteration, quartiles

FloatArray = npt.NDArray[np.float64]

RESOLVABLE_SPACINGS = 3.0
"""Steps shorter than this many sample spacings cannot be told apart in the samples."""
PAUSE_IQRS = 3.0
"""An iteration longer than Q3 + this many IQRs holds a pause (epoch end, evaluation): it is
counted but left out of the energy per iteration, which describes steady training."""
PAUSE_MEDIANS = 1.75
"""...and longer than this many median periods (very regular steps have a tiny IQR)."""


@dataclass
class IterationResult:
    """Count, period (median, IQR) and energy per iteration ± its standard error.

    ``method``: markers | power-segments | autocorrelation | counter (markers gave the
    count, the energy counter the energy, over groups of steps too short for the samples).
    ``resolvable``: whether the stream's samples can tell single steps apart.
    ``confidence``: for power-segments, the probability that the count is within 5 % and the
    energy within 10 % of the markers', calibrated on traces (docs/analysis.md); 1 for
    markers; 0 where the stream cannot resolve steps (the autocorrelation fallback: its
    correlation at the period is ``autocorrelation``).
    ``separation``: busy vs idle power levels in noise sds; ``regular_fraction``: share of
    periods 0.5–1.6× the median; ``period_spacings``: median period in sample spacings;
    ``thin_dips``: share of steps parted by a single idle sample (the confidence's inputs).
    ``groups``..``inner_integrality`` (method ``steps-in-bursts``): the power bursts once
    per group of steps (a loader stall every few steps); ``count`` and ``period_s`` are then
    the steps found inside the bursts (``inner_rhythm``), ``groups`` and
    ``group_period_s`` the bursts'.
    """

    period_s: float | None
    period_se_s: float | None
    confidence: float
    count: int
    mean_power_w: float
    energy_per_iteration_j: float | None
    energy_per_iteration_se_j: float | None
    rate_hz: float
    method: str = "power-segments"
    period_iqr_s: float | None = None
    resolvable: bool = True
    markers: str | None = None
    separation: float | None = None
    autocorrelation: float | None = None
    regular_fraction: float | None = None
    period_spacings: float | None = None
    thin_dips: float | None = None
    iterations_used: int = 0
    groups: int | None = None
    group_period_s: float | None = None
    steps_per_group: float | None = None
    inner_strength: float | None = None
    inner_integrality: float | None = None
    warnings: list[str] = field(default_factory=list)
    bursts: list[DetectedIteration] = field(default_factory=list, repr=False)
    """The bursts segmentation found (not in the JSON): where ``inner_rhythm`` looks."""
    valid: bool | None = None  # the stream's verdict over the span (docs/validity.md)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def iterations(self) -> int:
        """The count (the name of the field before methods other than a period existed)."""
        return self.count

    def to_json(self) -> dict[str, Any]:
        out = asdict(replace(self, bursts=[]))
        del out["bursts"]
        out["iterations"] = self.count
        return dict(json_safe(out))


@dataclass(frozen=True)
class SteadyStats:
    """Period distribution and mean energy per iteration over the steady iterations."""

    median_s: float
    iqr_s: float
    period_se_s: float
    energy_j: float
    energy_se_j: float
    used: int
    pauses: int


def steady_stats(periods_s: npt.ArrayLike, energies_j: npt.ArrayLike) -> SteadyStats | None:
    """Quartiles of all periods; energy mean ± se over those that hold no pause.

    The standard error is the spread of the per-iteration energies over √n: it holds the
    samples' noise and where each edge fell between two samples, both of which vary from
    one iteration to the next.
    """
    p = np.asarray(periods_s, dtype=np.float64)
    e = np.asarray(energies_j, dtype=np.float64)
    ok = np.isfinite(p) & np.isfinite(e)
    p, e = p[ok], e[ok]
    if p.size == 0:
        return None
    q1, med, q3 = quartiles(p)
    steady = p <= max(q3 + PAUSE_IQRS * (q3 - q1), PAUSE_MEDIANS * med)
    es = e[steady]
    n = es.size
    se_e = float(np.std(es, ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    # the median's standard error for a spread distribution: 1.2533·σ/√n, σ from the IQR
    se_p = 1.2533 * (q3 - q1) / 1.349 / math.sqrt(p.size) if p.size > 1 else math.nan
    return SteadyStats(med, q3 - q1, se_p, float(np.mean(es)), se_e, n, int(p.size - n))


def regular_fraction(periods_s: FloatArray, median_s: float) -> float:
    """Share of periods within 0.5–1.6× the median: a split step or a missed one falls out.

    Jitter of ±50 % stays inside; a step split in two makes periods under half the median,
    a missed step about twice it (1.6 rather than 1.9: the fit to simulated loops was better).
    """
    if periods_s.size == 0:
        return 0.0
    inside = (periods_s >= 0.5 * median_s) & (periods_s <= 1.6 * median_s)
    return float(np.mean(inside))
