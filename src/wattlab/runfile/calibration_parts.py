"""The fixed-shape parts of a calibration record (``calibration_record.CalibrationRecord``).

Each reads and writes its piece of the JSON document, keys in their order.

Why here and not beside the fit: the run file owns the format, and every reader of a
stored record (energy fusion, the report) needs the parts without the fitting code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Self, cast

from wattlab.errors import RunFileError


def finite(x: float | None) -> float | None:
    """A number as a record keeps it: a Python float, None where not finite (strict JSON)."""
    return None if x is None or not math.isfinite(x) else float(x)


def need(doc: Any, key: str | None, where: str) -> Any:
    """``doc[key]`` (``doc`` itself for None), or a RunFileError naming the dotted key."""
    dotted = ".".join(p for p in (where, key) if p)
    if not isinstance(doc, dict):
        raise RunFileError(f"{where or 'the record'} is not a JSON object")
    if key is None:
        return doc
    if key not in doc:
        raise RunFileError(f"lacks {dotted}")
    return doc[key]


class _Flat:
    """A part whose JSON object has exactly its fields as keys, in field order."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(cast(Any, self))}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Self:
        return cls(**{f.name: need(doc, f.name, where) for f in fields(cast(Any, cls))})

    @classmethod
    def read(cls, doc: Any, key: str, where: str) -> Self:
        """The part under ``doc[key]``."""
        return cls.from_json(need(doc, key, where), ".".join(p for p in (where, key) if p))


@dataclass(frozen=True)
class Estimate(_Flat):
    """A value with its standard error; None where the data could not give one."""

    value: float | None
    se: float | None

    @classmethod
    def of(cls, value: float, se: float) -> Estimate:
        """A fitted value and its standard error, None where either is not finite."""
        return cls(finite(value), finite(se))


@dataclass(frozen=True)
class StreamKey(_Flat):
    """What a calibration holds for: GPU model, board, driver version and NVML field."""

    gpu_model: str
    board: str
    driver_version: str
    nvml_field: str


@dataclass(frozen=True)
class TargetStream(_Flat):
    """The calibrated stream."""

    source: str
    channel: str
    unit: str


@dataclass(frozen=True)
class ReferenceStream(_Flat):
    """The stream it was calibrated against."""

    source: str
    channel: str
    model: str
    kind: str


@dataclass(frozen=True)
class CrossCorrelation(_Flat):
    """The first guess of the effective delay, by cross-correlation."""

    lag_s: float | None
    correlation: float | None
    confidence: float | None
    uncertainty_s: float | None


@dataclass(frozen=True)
class FitSummary(_Flat):
    """How well the chosen kernel fits, on how many readings."""

    rmse_w: float | None
    r2: float | None
    n_points: int
    grid_rate_hz: float
    blocks: int


@dataclass(frozen=True)
class KernelCandidate:
    """One kernel's best fit (each tried kernel's, so the choice can be checked)."""

    rmse_w: float | None
    tau_s: float | None
    width_name: str
    width: float | None

    def to_json(self) -> dict[str, Any]:
        return {"rmse_w": self.rmse_w, "tau_s": self.tau_s, self.width_name: self.width}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> KernelCandidate:
        widths = [k for k in need(doc, None, where) if k not in ("rmse_w", "tau_s")]
        if len(widths) != 1:
            raise RunFileError(f"lacks {where}.<width>")
        return cls(need(doc, "rmse_w", where), need(doc, "tau_s", where), widths[0],
                   doc[widths[0]])


@dataclass(frozen=True)
class GainTest:
    """Whether the gain depends on the power (``slope``), and whether that is warranted."""

    slope: Estimate
    meaning: str
    rmse_w: float | None
    warranted: bool

    def to_json(self) -> dict[str, Any]:
        return {"slope": self.slope.to_json(), "meaning": self.meaning,
                "rmse_w": self.rmse_w, "warranted": self.warranted}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> GainTest:
        return cls(Estimate.read(doc, "slope", where), need(doc, "meaning", where),
                   need(doc, "rmse_w", where), need(doc, "warranted", where))


@dataclass(frozen=True)
class Profiles:
    """Profile likelihoods (issue 20).

    The width's and the effective delay's ranges the data allow, whether each range is
    connected, and the load's repetition.
    """

    n_eff: float | None
    load_repeat_hz: float | None
    load_repeat_share: float | None
    width_name: str
    width_range: list[float | None]
    effective_delay_range: list[float | None]
    width_connected: bool
    delay_connected: bool

    def to_json(self) -> dict[str, Any]:
        return {"n_eff": self.n_eff, "load_repeat_hz": self.load_repeat_hz,
                "load_repeat_share": self.load_repeat_share,
                self.width_name: self.width_range,
                "effective_delay_s": self.effective_delay_range,
                "width_connected": self.width_connected,
                "delay_connected": self.delay_connected}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Profiles:
        fixed = ("n_eff", "load_repeat_hz", "load_repeat_share", "effective_delay_s",
                 "width_connected", "delay_connected")
        widths = [k for k in need(doc, None, where) if k not in fixed]
        if len(widths) != 1:
            raise RunFileError(f"lacks {where}.<width>")
        n_eff, hz, share, delay, w_ok, d_ok = (need(doc, k, where) for k in fixed)
        return cls(n_eff, hz, share, widths[0], doc[widths[0]], delay, w_ok, d_ok)


@dataclass(frozen=True)
class PhaseEnergy(_Flat):
    """One phase's energy: the reference's, the target's as read and as corrected."""

    name: str
    index: int
    t0_s: float
    t1_s: float
    duration_s: float
    reference_j: float | None
    reference_gap_s: float | None
    target_j: float | None
    corrected_j: float | None
    corrected_se_j: float | None
    error_before_pct: float | None
    error_after_pct: float | None


@dataclass(frozen=True)
class LengthErrors(_Flat):
    """Energy errors of phases of one length, slid over the run."""

    length_s: float
    windows: int
    rms_error_before_pct: float | None
    rms_error_after_pct: float | None
    p95_abs_error_after_pct: float | None


@dataclass(frozen=True)
class EnergyCheck:
    """The energy errors before and after correction: overall, per phase, per length."""

    overall: PhaseEnergy | None
    phases: list[PhaseEnergy]
    min_phase_s: float
    phases_considered: int
    mean_abs_error_before_pct: float | None
    mean_abs_error_after_pct: float | None
    by_length: list[LengthErrors]

    def to_json(self) -> dict[str, Any]:
        return {
            "overall": None if self.overall is None else self.overall.to_json(),
            "phases": [p.to_json() for p in self.phases],
            "min_phase_s": self.min_phase_s, "phases_considered": self.phases_considered,
            "mean_abs_error_before_pct": self.mean_abs_error_before_pct,
            "mean_abs_error_after_pct": self.mean_abs_error_after_pct,
            "by_length": [b.to_json() for b in self.by_length],
        }

    @classmethod
    def from_json(cls, doc: Any, where: str) -> EnergyCheck:
        overall = need(doc, "overall", where)
        return cls(
            None if overall is None else PhaseEnergy.from_json(overall, f"{where}.overall"),
            [PhaseEnergy.from_json(p, f"{where}.phases[{i}]")
             for i, p in enumerate(need(doc, "phases", where))],
            need(doc, "min_phase_s", where), need(doc, "phases_considered", where),
            need(doc, "mean_abs_error_before_pct", where),
            need(doc, "mean_abs_error_after_pct", where),
            [LengthErrors.from_json(b, f"{where}.by_length[{i}]")
             for i, b in enumerate(need(doc, "by_length", where))])


@dataclass(frozen=True)
class FigureVerdict(_Flat):
    """The validity verdict on one figure of a calibration (docs/validity.md, issue 37).

    ``figure``: ``params`` (the fitted parameters: both streams over the span fitted),
    ``overall``, ``phase:<label>`` (a marked phase's energy errors) or ``mean_abs_error``
    (the summary over long phases, a total: invalid where a phase it sums is, named in
    ``invalid_parts``). ``checks``: the six named checks, each over both streams.
    """

    figure: str
    t0_s: float | None
    t1_s: float | None
    valid: bool
    checks: dict[str, dict[str, Any]]
    invalid_parts: list[str]


@dataclass(frozen=True)
class CalibrationValidity:
    """Every figure's verdict; ``valid`` when all are (records before issue 37 lack it).

    ``left_out``: marked phases with no figure (no energy error could be taken), each with
    the checks that say why; listed so none is dropped in silence, not counted as figures.
    """

    valid: bool
    invalid_figures: int
    figures: list[FigureVerdict]
    left_out: list[FigureVerdict]

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "invalid_figures": self.invalid_figures,
                "figures": [f.to_json() for f in self.figures],
                "left_out": [f.to_json() for f in self.left_out]}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> CalibrationValidity:
        def parts(key: str) -> list[FigureVerdict]:
            return [FigureVerdict.from_json(f, f"{where}.{key}[{i}]")
                    for i, f in enumerate(need(doc, key, where))]

        return cls(bool(need(doc, "valid", where)), int(need(doc, "invalid_figures", where)),
                   parts("figures"), parts("left_out"))
