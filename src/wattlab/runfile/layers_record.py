"""The layer record in a run file: ``/analysis/layers``, as `wattlab layers --store` leaves it.

Why in the run file: the report draws it beside the run's power, and the record (counts,
measurements, plans) travels with the data it explains.
Why typed: the study built it as a dict and every reader spelled its keys again; the
classes here (parts in ``layers_parts``) name them once, and a record that lacks a key is
refused where it is read (issue 35). The JSON is the study's as it always was, byte for
byte: the fields keep its keys' order and a key it leaves out stays out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import h5py

from wattlab.errors import RunFileError
from wattlab.runfile import schema
from wattlab.runfile.h5_read import open_read_only
from wattlab.runfile.layers_parts import (
    OPTIONAL_KEY,
    ClockPlans,
    FoldedMeasured,
    FoldedSumCheck,
    GroupMeasured,
    GroupSumCheck,
    JsonPart,
    RooflineLimits,
    read_fields,
    write_fields,
)
from wattlab.runfile.records import add_record

RowMeasured = GroupMeasured | FoldedMeasured
SumCheck = GroupSumCheck | FoldedSumCheck


@dataclass(frozen=True, kw_only=True)
class CountedLayer(JsonPart):
    """One leaf module in one pass: its counts (``layers.counting.LayerRow``), its class.

    ``measured`` once ``--measure`` ran: the simulated GPU's form or a real GPU's.
    """

    name: str  # the module's path in the model ("" for a model that is itself one layer)
    kind: str  # its class name
    pass_name: str  # "forward" or "backward"
    calls: int
    flops: int
    work_flops: int
    weight_bytes: int
    activation_bytes: int
    gradient_bytes: int
    in_shapes: tuple[tuple[int, ...], ...]
    input_requires_grad: bool
    macs: int
    bytes_total: int
    intensity: float | None  # FLOP per byte; None where no byte moves
    bound: str  # "compute" or "memory", against the roofline
    measured: RowMeasured | None = field(default=None, metadata=OPTIONAL_KEY)

    @property
    def key(self) -> str:
        """``<name>:<pass>``: how measurements and plans name the row."""
        return f"{self.name or '(model)'}:{self.pass_name}"


@dataclass(frozen=True, kw_only=True)
class LayersRecord:
    """What `wattlab layers` found for one model: counts per layer, measurements, plans.

    ``checks`` (per scope: the rows summed against the whole step) once measured, ``plans``
    once planned; ``device`` says which GPU, simulated or real, and ``model`` which model.
    """

    input: tuple[int, ...]  # the input's shape, batch first
    dtype: str
    train: bool
    roofline: RooflineLimits
    total_flops: int
    total_macs: int
    other_flops: int  # counted outside every leaf module
    rows: tuple[CountedLayer, ...]
    device: str
    checks: dict[str, SumCheck] | None = field(default=None, metadata=OPTIONAL_KEY)
    plans: ClockPlans | None = field(default=None, metadata=OPTIONAL_KEY)
    model: str

    def to_json(self, indent: int | None = None) -> str:
        """The record's JSON: what the run file stores and `wattlab layers --json` prints."""
        return json.dumps(write_fields(self), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> LayersRecord:
        """A record from its JSON; RunFileError names a key it lacks or mistypes."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise RunFileError(f"the layers record is not JSON: {e}") from e
        return read_fields(cls, doc, "")

    def measured_as(self, by_key: Mapping[str, RowMeasured],
                    checks: dict[str, SumCheck]) -> LayersRecord:
        """The record with each row's measurement (rows ``by_key`` lacks keep theirs)."""
        rows = tuple(replace(r, measured=by_key.get(r.key, r.measured)) for r in self.rows)
        return replace(self, rows=rows, checks=checks)


def write_layers(path: str, record: LayersRecord) -> None:
    """Store (or replace) the record (``record.to_json()``)."""
    def fill(group: h5py.Group) -> None:
        group.attrs[schema.RECORD_JSON] = record.to_json()

    add_record(path, (schema.LAYERS,), fill)


def read_layers(path: str) -> LayersRecord | None:
    """The stored layer record, or None; RunFileError names the file and a bad key."""
    with open_read_only(path) as f:
        g = f.get(f"{schema.ANALYSIS}/{schema.LAYERS}")
        text = None if g is None else g.attrs[schema.RECORD_JSON]
    if text is None:
        return None
    try:
        return LayersRecord.from_json(text)
    except RunFileError as e:
        raise RunFileError(f"{path}: layers record: {e}") from e
