"""The qualification of each target against the reference: MLPerf's score and finer windows.

Per target: each level's Olympic mean beside the reference's, their relative difference,
x % (the largest over the levels), pass/fail at the stated x, and each window's validity
verdict (docs/validity.md). Then what MLPerf does not ask: the |difference| of 0.1 s, 1 s
and 10 s window means inside the same levels, median and p95, which shows at what time
scale a meter stops agreeing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import json_safe, resolve
from wattlab.analysis.energy import invalid_reasons, record_applies, windows_verdict
from wattlab.analysis.qualify.calibration_origin import same_run
from wattlab.analysis.qualify.levels import Level, place_windows
from wattlab.analysis.qualify.olympic import WINDOWS_PER_LEVEL, olympic_mean
from wattlab.analysis.qualify.parts import Part, check_same_system, parts_of
from wattlab.analysis.qualify.scope import reference_stream, refusal
from wattlab.analysis.qualify.window_means import window_means
from wattlab.errors import UsageError
from wattlab.runfile import CalibrationRecord, Run, SourceView

FloatArray = npt.NDArray[np.float64]
FINE_WINDOWS_S = (0.1, 1.0, 10.0)
MLPERF_WINDOW_S = 60.0
SHORT_WINDOW_S = 12.0
DEFAULT_MAX_PCT = 5.0


@dataclass
class TargetVerdict:
    """One target's qualification (``refused``: why it was not scored).

    ``passed``: x is within the stated x %; ``valid``: every scored window of target and
    reference passed its validity verdict (``invalid_windows`` says which did not and why).
    ``x_pm_pct``: how far x would move if its level's windows were drawn again (the scatter
    of that level's five window differences): a view sampled at points scatters more than
    one that averages, and two runs' x agree only within their ±.
    """

    target: str
    corrected: bool = False
    refused: str | None = None
    x_pct: float | None = None
    x_pm_pct: float | None = None
    passed: bool | None = None
    valid: bool | None = None
    levels: list[dict[str, Any]] = field(default_factory=list)
    fine: list[dict[str, Any]] = field(default_factory=list)
    invalid_windows: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return json_safe(self.__dict__)


@dataclass(frozen=True)
class Procedure:
    """What is asked: window length, the x to pass at, settling time, who measures what."""

    window_s: float = MLPERF_WINDOW_S
    max_pct: float = DEFAULT_MAX_PCT
    settle_s: float = 2.0
    told: Mapping[str, str] = field(default_factory=dict)


def _fine_bins(levels: Sequence[Level]) -> list[tuple[float, FloatArray]]:
    """(window s, bins) of each fine size, laid over each level's five windows' span."""
    out = []
    for size in FINE_WINDOWS_S:
        edges = [np.arange(lv.windows_s[0][0], lv.windows_s[-1][1] - size + 1e-9, size)
                 for lv in levels]
        starts = np.concatenate(edges)
        out.append((size, np.column_stack([starts, starts + size])))
    return out


def _all_windows(levels: Sequence[Level]) -> tuple[FloatArray, list[tuple[float, FloatArray]]]:
    five = np.array([w for lv in levels for w in lv.windows_s], dtype=np.float64)
    return five, _fine_bins(levels)


def _means(run: Run, view: SourceView, channel: str, levels: Sequence[Level],
           record: CalibrationRecord | None) -> tuple[FloatArray, list[FloatArray]]:
    """The 15 scored window means and each fine size's, in one pass over the stream."""
    five, fine = _all_windows(levels)
    stacked = np.concatenate([five, *[bins for _, bins in fine]])
    means = window_means(run, view, channel, stacked, record)
    out, k = [], len(five)
    for _, bins in fine:
        out.append(means[k:k + len(bins)])
        k += len(bins)
    return means[:len(five)], out


def _invalid_windows(run: Run, view: SourceView, channel: str, levels: Sequence[Level]
                     ) -> list[str]:
    """Labels of the scored windows whose validity verdict fails, with the failing checks."""
    windows = [(f"{lv.name} w{k + 1}", a, b) for lv in levels
               for k, (a, b) in enumerate(lv.windows_s)]
    rows = windows_verdict(run, view, channel, windows)
    return [f"{r.source} {r.phase}: {'; '.join(invalid_reasons(r.to_json()))}" for r in rows
            if not r.valid]


def scatter_pm_pct(reference_w: FloatArray, target_w: FloatArray) -> float:
    """The ± of a level's Olympic difference from its windows' scatter, % of the reference.

    The standard deviation of the five per-window differences over the square root of the
    three the score keeps: the score's own sampling error if the windows were drawn again
    (a window's mean from a view read at points moves with where the points fell).
    """
    rel = 100.0 * (target_w - reference_w) / np.abs(reference_w)
    if rel.size < 2 or not np.all(np.isfinite(rel)):
        return math.nan
    return float(np.std(rel, ddof=1) / math.sqrt(WINDOWS_PER_LEVEL - 2))


def _score(name: str, ref: tuple[FloatArray, list[FloatArray]],
           tgt: tuple[FloatArray, list[FloatArray]], levels: Sequence[Level],
           procedure: Procedure) -> TargetVerdict:
    verdict = TargetVerdict(name)
    worst, worst_pm = 0.0, 0.0
    for i, lv in enumerate(levels):
        r5, t5 = ref[0][5 * i:5 * i + 5], tgt[0][5 * i:5 * i + 5]
        r_ol, t_ol = olympic_mean(list(r5)), olympic_mean(list(t5))
        diff = 100.0 * abs(t_ol - r_ol) / abs(r_ol) if r_ol else math.nan
        pm = scatter_pm_pct(r5, t5)
        if not math.isfinite(diff):
            worst = worst_pm = math.nan
        elif diff >= worst:
            worst, worst_pm = diff, pm
        verdict.levels.append({"level": lv.name, "windows_s": [list(w) for w in lv.windows_s],
                               "reference_w": list(r5), "target_w": list(t5),
                               "reference_olympic_w": r_ol, "target_olympic_w": t_ol,
                               "difference_pct": diff, "difference_pm_pct": pm})
    verdict.x_pct, verdict.x_pm_pct = worst, worst_pm
    verdict.passed = bool(math.isfinite(worst) and worst <= procedure.max_pct)
    for size, r, t in zip(FINE_WINDOWS_S, ref[1], tgt[1], strict=True):
        rel = 100.0 * np.abs(t - r) / np.abs(r)
        rel = rel[np.isfinite(rel)]
        verdict.fine.append({"window_s": size, "windows": int(rel.size),
                             "median_pct": float(np.median(rel)) if rel.size else None,
                             "p95_pct": float(np.percentile(rel, 95)) if rel.size else None})
    return verdict


def qualify(runs: Run | Sequence[Run], reference: str, targets: Sequence[str],
            procedure: Procedure, record: CalibrationRecord | None = None
            ) -> list[TargetVerdict]:
    """Every target's verdict against ``reference`` over the marked levels.

    Of one run, or of several runs holding a level each (a qualification recorded in parts).
    """
    parts = [Part(p.run, tuple(place_windows(lv, procedure.window_s, procedure.settle_s)
                                for lv in p.levels))
             for p in parts_of([runs] if isinstance(runs, Run) else runs)]
    levels = [lv for p in parts for lv in p.levels]
    check_same_system(parts, lambda run: reference_stream(run, reference)[0])
    for p in parts:
        if record is not None and (why := same_run(p.run, record)) is not None:
            raise UsageError(f"--calibration: refused: {why}; qualify calibrated NVML with "
                             "a calibration from another run")
    ref_streams = [reference_stream(p.run, reference) for p in parts]
    ref_means = _means_of_parts(parts, ref_streams, None)
    ref_invalid = _invalid_of_parts(parts, ref_streams)
    out: list[TargetVerdict] = []
    for spec in targets:
        check_same_system(parts, partial(_view, spec=spec))
        streams = [resolve(p.run, spec) for p in parts]
        view, channel = streams[0]
        name = f"{view.source_id}:{channel}"
        why_not = refusal(ref_streams[0], (view, channel), procedure.told)
        if why_not is not None:
            out.append(TargetVerdict(name, refused=why_not))
            continue
        invalid = ref_invalid + _invalid_of_parts(parts, streams)
        runs_of: list[CalibrationRecord | None] = [None]
        if record is not None and record_applies(record, view, channel) is not None:
            runs_of.append(record)
        for rec in runs_of:
            verdict = _score(name, ref_means, _means_of_parts(parts, streams, rec), levels,
                             procedure)
            verdict.corrected = rec is not None
            verdict.invalid_windows = invalid
            verdict.valid = not invalid
            out.append(verdict)
    return out


def _view(run: Run, spec: str) -> SourceView:
    return resolve(run, spec)[0]


def _means_of_parts(parts: Sequence[Part], streams: Sequence[tuple[SourceView, str]],
                    record: CalibrationRecord | None) -> tuple[FloatArray, list[FloatArray]]:
    """The scored and fine window means of every part, in the parts' level order."""
    each = [_means(p.run, view, channel, p.levels, record)
            for p, (view, channel) in zip(parts, streams, strict=True)]
    five = np.concatenate([m[0] for m in each])
    fine = [np.concatenate([m[1][k] for m in each]) for k in range(len(FINE_WINDOWS_S))]
    return five, fine


def _invalid_of_parts(parts: Sequence[Part], streams: Sequence[tuple[SourceView, str]]
                      ) -> list[str]:
    return [why for p, (view, channel) in zip(parts, streams, strict=True)
            for why in _invalid_windows(p.run, view, channel, p.levels)]
