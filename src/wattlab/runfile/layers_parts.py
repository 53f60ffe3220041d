"""The parts of the layer record (``layers_record.LayersRecord``) and how each reads its JSON.

Each part is a frozen dataclass whose fields are its JSON object's keys, in the order the
study writes them, so ``to_json`` gives back the very document (and bytes) it was read
from. ``from_json`` checks every key against the field's type: a record that lacks a key
or holds a wrongly typed value is a RunFileError naming the key's dotted path, not a
KeyError or a wrong number deep inside the report.

Why one reader driven by the type hints rather than a ``from_json`` per class, as the
calibration record has: the layer record has some 130 keys over sixteen classes, and a
row's measurement and a scope's check each come in a simulated-GPU and a real-GPU form
(a union: the first form that reads wins); spelled per class, every key would be written
three times (field, reader, writer) and drift apart. Keys a newer writer adds are ignored.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Self, TypeVar, cast

from wattlab.errors import RunFileError
from wattlab.runfile.calibration_parts import need

T = TypeVar("T")
_OPTIONAL = "optional key"
OPTIONAL_KEY = {_OPTIONAL: True}
"""A field's metadata: the study leaves its key out when it has no value (None)."""
_JSON_TYPES = {float: (int, float), int: (int,), str: (str,), bool: (bool,)}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _join(where: str, key: str) -> str:
    return ".".join(p for p in (where, key) if p)


def _union(members: tuple[Any, ...], value: Any, where: str) -> Any:
    """The first member type that reads ``value`` (a part's simulated or real-GPU form)."""
    if value is None and type(None) in members:
        return None
    tried = [m for m in members if m is not type(None)]
    if len(tried) == 1:
        return read_value(tried[0], value, where)
    errors = []
    for member in tried:
        try:
            return read_value(member, value, where)
        except RunFileError as e:
            errors.append(f"{member.__name__} ({e})")
    raise RunFileError(f"{where} is none of: {'; '.join(errors)}")


def read_value(tp: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as type ``tp``, or a RunFileError naming ``where``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return _union(args, value, where)
    if origin is tuple:  # tuple[X, ...]: a JSON list
        if not isinstance(value, list):
            raise RunFileError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(read_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:  # dict[str, X]: a JSON object, its keys in order
        return {k: read_value(args[1], v, _join(where, k))
                for k, v in need(value, None, where).items()}
    if isinstance(tp, type) and issubclass(tp, JsonPart):
        return tp.from_json(value, where)
    ok = _JSON_TYPES.get(tp)
    if ok is None:
        raise TypeError(f"{where}: {tp!r} is not a type the layer record's JSON holds")
    if not isinstance(value, ok) or (isinstance(value, bool) and tp is not bool):
        raise RunFileError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    return value


def read_fields(cls: type[T], doc: Any, where: str) -> T:
    """A dataclass from its JSON object: every field's key read and checked."""
    need(doc, None, where)
    hints = _hints(cast(type, cls))
    values = {}
    for f in fields(cast(Any, cls)):
        if f.metadata.get(_OPTIONAL) and f.name not in doc:
            continue
        values[f.name] = read_value(hints[f.name], need(doc, f.name, where),
                                    _join(where, f.name))
    return cls(**values)


def _write(value: Any) -> Any:
    if isinstance(value, JsonPart):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_write(v) for v in value]
    if isinstance(value, dict):
        return {k: _write(v) for k, v in value.items()}
    return value


def write_fields(obj: Any) -> dict[str, Any]:
    """A dataclass as its JSON object: fields in order, an optional key left out when None."""
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if not (value is None and f.metadata.get(_OPTIONAL)):
            out[f.name] = _write(value)
    return out


class JsonPart:
    """A part of the record: a frozen dataclass whose fields are its JSON object's keys."""

    def to_json(self) -> dict[str, Any]:
        return write_fields(self)

    @classmethod
    def from_json(cls, doc: Any, where: str = "") -> Self:
        return read_fields(cls, doc, where)


@dataclass(frozen=True, kw_only=True)
class RooflineLimits(JsonPart):
    """The roofline the rows were classed against (``device_models.Roofline``)."""

    peak_flops: float  # FLOP/s
    bandwidth_bps: float  # bytes/s
    ridge_flop_per_byte: float
    source: str


@dataclass(frozen=True, kw_only=True)
class MeasuredRun(JsonPart):
    """One run of a job measured for a window: the whole pass, or an executed plan.

    Every value is a float (``layers.measure.Measured.to_record``), ``repeats`` too.
    """

    time_s: float
    time_se_s: float
    energy_j: float
    energy_se_j: float
    power_w: float
    power_se_w: float
    repeats: float
    window_s: float


@dataclass(frozen=True, kw_only=True)
class TimeEnergy(JsonPart):
    """A row's time and energy per step, each ± one standard error (nothing else known)."""

    time_s: float
    time_se_s: float
    energy_j: float
    energy_se_j: float


@dataclass(frozen=True, kw_only=True)
class GroupMeasured(JsonPart):
    """A row on the simulated GPU: time inside the step, power of its group run alone."""

    time_s: float
    time_se_s: float
    time_alone_s: float  # one run replayed alone, back to back
    power_w: float
    power_se_w: float
    energy_j: float
    energy_se_j: float
    group: int  # which run of consecutive rows shared the power measurement
    group_size: int


@dataclass(frozen=True, kw_only=True)
class FoldedMeasured(JsonPart):
    """A row on a real GPU: busy time from the kernels, power from NVML's folded samples.

    The powers are None for a row the samples' layout does not hold (its energy is then 0).
    """

    time_s: float
    time_se_s: float
    power_w: float | None
    power_se_w: float | None
    power_stat_se_w: float | None  # the samples' spread alone
    power_delay_w: float | None  # the sample delay's uncertainty alone
    energy_j: float
    energy_se_j: float


@dataclass(frozen=True, kw_only=True)
class BetweenLayers(JsonPart):
    """The simulated step's time outside every layer, at the whole step's power."""

    time_s: float
    time_se_s: float
    power_w: float
    power_se_w: float
    energy_j: float
    energy_se_j: float
    note: str


@dataclass(frozen=True, kw_only=True)
class GroupSumCheck(JsonPart):
    """The simulated GPU's rows and ``between`` summed, against the whole step measured."""

    layers_time_s: float
    layers_time_se_s: float
    layers_alone_time_s: float
    layers_energy_j: float
    layers_energy_se_j: float
    steps: int
    between: BetweenLayers
    whole: MeasuredRun
    time_error: float  # relative: sum / whole - 1
    energy_error: float
    warning: str | None  # why the in-step times cannot be trusted (host-bound)


@dataclass(frozen=True, kw_only=True)
class StepTotals(JsonPart):
    """A real GPU's plain step: its time alone and the energy counter's energy per step."""

    time_s: float
    energy_j: float  # NaN without an energy counter
    energy_se_j: float
    run_step_s: float  # the step beside the sample reader


@dataclass(frozen=True, kw_only=True)
class FoldedSumCheck(JsonPart):
    """A real GPU's rows (busy + idle) summed, against the plain step and the counter."""

    layers_time_s: float
    layers_time_se_s: float
    busy_s: float
    idle_s: float | None  # None without a usable plain profiled run
    layers_energy_j: float
    layers_energy_se_j: float
    whole: StepTotals
    time_error: float
    energy_error: float
    hooked_steps: int
    run_steps: int
    samples: int
    bins: int
    delay_s: float
    note: str
    warning: str | None
    outside_rows: dict[str, FoldedMeasured]  # ``between layers``, ``GPU idle (host-bound)``
    # zeros (TimeEnergy) where no kernel ran between; the fuller form first: it is tried first
    between: FoldedMeasured | TimeEnergy


@dataclass(frozen=True, kw_only=True)
class PlanCost(JsonPart):
    """One clock plan costed on the simulator's surface (``layers.plan.Plan.to_record``)."""

    name: str
    time_s: float
    energy_j: float
    switches: int
    gap_j: float | None  # at most this far above the optimum; None but for exhaustive
    note: str | None
    energy_saving: float  # relative to the default clocks
    slowdown: float
    saving_free_switches: float
    sm_mhz: tuple[int, ...]  # per plan row
    mem_mhz: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class SlowdownPlans(JsonPart):
    """The exhaustive and the heuristic plan within one slowdown bound."""

    max_slowdown: float
    exhaustive: PlanCost
    heuristic: PlanCost


@dataclass(frozen=True, kw_only=True)
class ScopePlans(JsonPart):
    """The plans of one scope (forward, or the training step), row keys in order."""

    keys: tuple[str, ...]
    default: PlanCost
    plans: tuple[SlowdownPlans, ...]
    # simulated GPU only
    executed: dict[str, MeasuredRun] | None = field(default=None, metadata=OPTIONAL_KEY)


@dataclass(frozen=True, kw_only=True)
class ClockSource(JsonPart):
    """Where the plans' clock pairs came from: NVML's list, or the simulated one and why."""

    source: str
    reason: str | None = field(default=None, metadata=OPTIONAL_KEY)  # why not NVML's
    pairs: int | None = field(default=None, metadata=OPTIONAL_KEY)
    # NVML's, highest first
    mem_mhz: tuple[int, ...] | None = field(default=None, metadata=OPTIONAL_KEY)
    # NVML's lowest and highest
    sm_mhz_range: tuple[int, ...] | None = field(default=None, metadata=OPTIONAL_KEY)


@dataclass(frozen=True, kw_only=True)
class ClockPlans(JsonPart):
    """The clock plans of every scope (``layers.study.plan_record``)."""

    switch_s: float
    pairs: int
    rows: str  # "per call" or "per module"
    scopes: dict[str, ScopePlans]
    clocks: ClockSource | None = field(default=None, metadata=OPTIONAL_KEY)
    # on a real GPU: a prediction, nothing changed
    note: str | None = field(default=None, metadata=OPTIONAL_KEY)
