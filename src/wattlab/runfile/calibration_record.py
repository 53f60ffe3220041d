"""Calibration records in a run file: ``/analysis/calibration/<source>:<channel>``.

Why in the run file: a calibration belongs to the recording it was fitted on, and the
report shows the stored ones beside it. The record (the JSON document `wattlab calibrate`
makes, ``CalibrationRecord.to_json``) is kept whole; its kernel, identifiability and pinned
parameters are repeated as attributes so that HDF5 tools show them without parsing JSON.
Why typed: every reader of a record once spelled its keys as strings; a class names them
once, here, and says which keys an older record may lack (issue 35).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import h5py

from wattlab.errors import RunFileError
from wattlab.runfile import schema
from wattlab.runfile.calibration_parts import (
    CalibrationValidity,
    CrossCorrelation,
    EnergyCheck,
    Estimate,
    FitSummary,
    GainTest,
    KernelCandidate,
    Profiles,
    ReferenceStream,
    StreamKey,
    TargetStream,
    need,
)
from wattlab.runfile.h5_read import open_read_only
from wattlab.runfile.records import add_record

RECORD_FORMAT = "wattlab-calibration/1"
FIXED_PARAMS = ("tau_s", "gain", "offset_w")
"""The fitted parameters every kernel has; the fourth is its width (``FittedParams``)."""


@dataclass(frozen=True)
class FittedParams:
    """The kernel's parameters with standard errors.

    The width's name depends on the kernel: ``w_s`` for a boxcar, ``time_constant_s`` for
    a first-order lag.
    """

    tau_s: Estimate
    width_name: str
    width: Estimate
    gain: Estimate
    offset_w: Estimate

    def pinned(self) -> dict[str, float]:
        """The parameters the data gave a value, by name (the run file's attributes)."""
        return {name: e.value for name, e in self.by_name().items() if e.value is not None}

    def by_name(self) -> dict[str, Estimate]:
        """Each parameter by its record name, in the record's order."""
        return {"tau_s": self.tau_s, self.width_name: self.width, "gain": self.gain,
                "offset_w": self.offset_w}

    def to_json(self) -> dict[str, Any]:
        return {name: e.to_json() for name, e in self.by_name().items()}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> FittedParams:
        widths = [k for k in need(doc, None, where) if k not in FIXED_PARAMS]
        if len(widths) != 1:
            raise RunFileError(f"lacks {where}.<width> (one of w_s, time_constant_s)")
        return cls(Estimate.read(doc, "tau_s", where), widths[0],
                   Estimate.read(doc, widths[0], where), Estimate.read(doc, "gain", where),
                   Estimate.read(doc, "offset_w", where))


@dataclass(frozen=True)
class Identifiability:
    """Whether the data could pin the kernel, why not, and what recording would (issue 20).

    Records made before issue 20 lack it and count as identifiable.
    """

    identifiable: bool = True
    warnings: tuple[str, ...] = ()
    advice: str = ""


@dataclass(frozen=True)
class CalibrationRecord:
    """One stream's calibration: what was fitted against what, and how well it holds.

    Fields follow the JSON document's keys and order (``to_json``); ``verdict`` is the
    document's ``identifiable``, ``warnings`` and ``advice``. Values the fit could not give
    are None, as in the JSON.
    """

    format: str
    key: StreamKey
    target: TargetStream
    reference: ReferenceStream
    run: str
    created: str
    convention: str
    kernel: str
    params: FittedParams
    effective_delay_s: Estimate
    energy_delay_s: Estimate
    cross_correlation_lag: CrossCorrelation
    update_period_s: float
    held_readings: bool
    update_times: str  # "lattice" or "first_seen": when each reading counts as observed
    poll_delay_s: float | None
    coverage: float
    fit: FitSummary
    kernels: dict[str, KernelCandidate]
    power_dependent_gain: GainTest
    energy: EnergyCheck
    verdict: Identifiability = field(default_factory=Identifiability)
    profiles: Profiles | None = None  # issue 20 on
    update_period_se_s: float | None = None  # issue 20 on
    validity: CalibrationValidity | None = None  # issue 37 on: every figure's verdict

    @property
    def where(self) -> str:
        """The target stream as ``<source>:<channel>`` (the run file's group name)."""
        return f"{self.target.source}:{self.target.channel}"

    def to_json(self) -> dict[str, Any]:
        """The JSON document `wattlab calibrate --json` prints, keys in its order."""
        v = self.verdict
        return {
            "format": self.format, "key": self.key.to_json(), "target": self.target.to_json(),
            "reference": self.reference.to_json(), "run": self.run, "created": self.created,
            "convention": self.convention, "kernel": self.kernel,
            "params": self.params.to_json(),
            "effective_delay_s": self.effective_delay_s.to_json(),
            "energy_delay_s": self.energy_delay_s.to_json(),
            "cross_correlation_lag": self.cross_correlation_lag.to_json(),
            "identifiable": v.identifiable, "warnings": list(v.warnings), "advice": v.advice,
            "profiles": None if self.profiles is None else self.profiles.to_json(),
            "update_period_s": self.update_period_s,
            "update_period_se_s": self.update_period_se_s,
            "held_readings": self.held_readings, "update_times": self.update_times,
            "poll_delay_s": self.poll_delay_s, "coverage": self.coverage,
            "fit": self.fit.to_json(),
            "kernels": {name: k.to_json() for name, k in self.kernels.items()},
            "power_dependent_gain": self.power_dependent_gain.to_json(),
            "energy": self.energy.to_json(),
        } | ({} if self.validity is None else {"validity": self.validity.to_json()})

    @classmethod
    def from_json(cls, doc: Any) -> CalibrationRecord:
        """A record from its JSON document; RunFileError names a required key it lacks."""
        def get(key: str) -> Any:
            return need(doc, key, "")

        profiles = doc.get("profiles") if isinstance(doc, dict) else None
        validity = doc.get("validity") if isinstance(doc, dict) else None
        return cls(
            get("format"), StreamKey.read(doc, "key", ""), TargetStream.read(doc, "target", ""),
            ReferenceStream.read(doc, "reference", ""), get("run"), get("created"),
            get("convention"), get("kernel"), FittedParams.from_json(get("params"), "params"),
            Estimate.read(doc, "effective_delay_s", ""), Estimate.read(doc, "energy_delay_s", ""),
            CrossCorrelation.read(doc, "cross_correlation_lag", ""), get("update_period_s"),
            get("held_readings"), get("update_times"), get("poll_delay_s"), get("coverage"),
            FitSummary.read(doc, "fit", ""),
            {name: KernelCandidate.from_json(k, f"kernels.{name}")
             for name, k in need(get("kernels"), None, "kernels").items()},
            GainTest.from_json(get("power_dependent_gain"), "power_dependent_gain"),
            EnergyCheck.from_json(get("energy"), "energy"),
            Identifiability(bool(doc.get("identifiable", True)),
                            tuple(doc.get("warnings", ())), doc.get("advice") or ""),
            None if profiles is None else Profiles.from_json(profiles, "profiles"),
            doc.get("update_period_se_s"),
            None if validity is None else CalibrationValidity.from_json(validity, "validity"))


def write_calibration(path: str, record: CalibrationRecord, *, hint: str = "") -> str:
    """Store (or replace) one stream's calibration; the group's path in the file."""
    def fill(group: h5py.Group) -> None:
        group.attrs[schema.RECORD_JSON] = json.dumps(record.to_json(), sort_keys=True)
        group.attrs[schema.KERNEL] = record.kernel
        group.attrs[schema.IDENTIFIABLE] = record.verdict.identifiable
        if record.validity is not None:
            group.attrs[schema.ALL_VALID] = record.validity.valid
        for name, value in record.params.pinned().items():
            group.attrs[name] = value

    return add_record(path, (schema.CALIBRATION, record.where), fill, hint=hint)


def read_calibrations(path: str) -> list[CalibrationRecord]:
    """The calibration records stored in a run file, in key order.

    A record that lacks a required key is a RunFileError naming the file, the record and
    the key: a half-read calibration would correct energy with made-up numbers.
    """
    with open_read_only(path) as f:
        group = f.get(f"{schema.ANALYSIS}/{schema.CALIBRATION}")
        if group is None:
            return []
        docs = {key: json.loads(group[key].attrs[schema.RECORD_JSON]) for key in group}
    records = []
    for key, doc in docs.items():
        try:
            records.append(CalibrationRecord.from_json(doc))
        except RunFileError as e:
            raise RunFileError(f"{path}: calibration record {key}: {e}") from e
    return records
