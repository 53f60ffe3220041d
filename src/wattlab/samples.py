"""Core data types shared by drivers, sources, the bus and the recorder.

Everything here is plain data with SI units, so a driver converts at its boundary and
nothing downstream has to know which instrument produced a number.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.errors import UsageError

SOURCE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
ALLOWED_VALUE_DTYPES = ("<f4", "<f8")
ALLOWED_TIME_RAW_DTYPES = ("<i8", "<f8")


class SampleFlag(enum.IntFlag):
    """Per-sample flags; stored as uint8 in the run file (attribute ``flag_bits`` names them)."""

    NONE = 0
    OVERRANGE = 1
    NO_DATA = 2
    REPEAT = 4
    RESYNC = 8
    MARKER = 16
    ESTIMATED_TIME = 32
    # set by the recorder at ingest (never by a source): the time goes backwards from the
    # stream's previous row, is negative, or is over an hour past the recorder's clock
    TIME_INVALID = 64
    # set by the recorder at ingest: a value is NaN or infinite and the row is not NO_DATA
    NOT_FINITE = 128


def flag_names() -> dict[str, int]:
    """Flag bit names for the run file's ``flag_bits`` attribute."""
    return {f.name.lower(): int(f.value) for f in SampleFlag if f.value and f.name}


def check_source_id(source_id: str) -> str:
    """Source ids become HDF5 group names and ZeroMQ topics: keep them plain."""
    if not SOURCE_ID_PATTERN.match(source_id):
        raise UsageError(
            f"source id {source_id!r} is not valid: use 1-64 letters, digits, '_', '.', '-'"
        )
    return source_id


@dataclass(frozen=True)
class Channel:
    """One column of a source's values: its name, SI unit, and what it really is."""

    name: str
    unit: str
    meaning: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "unit": self.unit, "meaning": self.meaning}

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Channel:
        return Channel(str(obj["name"]), str(obj["unit"]), str(obj.get("meaning", "")))


@dataclass(frozen=True)
class SourceDescriptor:
    """What a stream is: enough to interpret its numbers years later without the bench.

    ``time_raw`` says what the raw time column holds (e.g. ``host_monotonic_ns`` or
    ``device_unix_us``); ``config`` holds instrument settings and notes (JSON-safe).
    """

    source_id: str
    kind: str
    model: str
    channels: tuple[Channel, ...]
    serial: str = ""
    firmware: str = ""
    transport: str = ""
    host: str = ""
    value_dtype: str = "<f8"
    time_raw: str = "host_monotonic_ns"
    time_raw_dtype: str = "<i8"
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_source_id(self.source_id)
        if not self.channels:
            raise UsageError(f"source {self.source_id!r} declares no channels")
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise UsageError(f"source {self.source_id!r} has duplicate channel names {names}")
        if self.value_dtype not in ALLOWED_VALUE_DTYPES:
            raise UsageError(f"source {self.source_id!r}: value dtype {self.value_dtype!r}")
        if self.time_raw_dtype not in ALLOWED_TIME_RAW_DTYPES:
            raise UsageError(f"source {self.source_id!r}: raw time dtype {self.time_raw_dtype!r}")

    @property
    def channel_names(self) -> list[str]:
        return [c.name for c in self.channels]

    def to_json(self) -> dict[str, Any]:
        return {
            "source_id": self.source_id,
            "kind": self.kind,
            "model": self.model,
            "channels": [c.to_json() for c in self.channels],
            "serial": self.serial,
            "firmware": self.firmware,
            "transport": self.transport,
            "host": self.host,
            "value_dtype": self.value_dtype,
            "time_raw": self.time_raw,
            "time_raw_dtype": self.time_raw_dtype,
            "config": self.config,
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> SourceDescriptor:
        try:
            return SourceDescriptor(
                source_id=str(obj["source_id"]),
                kind=str(obj["kind"]),
                model=str(obj["model"]),
                channels=tuple(Channel.from_json(c) for c in obj["channels"]),
                serial=str(obj.get("serial", "")),
                firmware=str(obj.get("firmware", "")),
                transport=str(obj.get("transport", "")),
                host=str(obj.get("host", "")),
                value_dtype=str(obj.get("value_dtype", "<f8")),
                time_raw=str(obj.get("time_raw", "host_monotonic_ns")),
                time_raw_dtype=str(obj.get("time_raw_dtype", "<i8")),
                config=dict(obj.get("config", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"malformed source descriptor: {e}") from e


@dataclass
class SampleBatch:
    """n samples of one source: host time, optional raw device time, n × channels values.

    ``seq`` numbers batches per source; a batch that joins several consecutive ones
    (publisher-side coalescing) covers ``seq`` .. ``seq_last``.

    ``t_host_ns`` is the host's monotonic clock (``time.monotonic_ns``) for each sample;
    ``t_raw`` is the instrument's own clock where it has one (else omitted: the recorder
    then stores the host time as raw time).
    """

    source_id: str
    seq: int
    t_host_ns: npt.NDArray[np.int64]
    values: npt.NDArray[np.floating[Any]]
    t_raw: npt.NDArray[Any] | None = None
    flags: npt.NDArray[np.uint8] | None = None
    seq_last: int | None = None

    def __post_init__(self) -> None:
        if self.seq_last is not None and self.seq_last < self.seq:
            raise UsageError(f"batch of {self.source_id!r}: seq_last {self.seq_last} < seq "
                             f"{self.seq}")
        n = self.t_host_ns.shape[0]
        if self.t_host_ns.ndim != 1 or self.values.ndim != 2 or self.values.shape[0] != n:
            raise UsageError(
                f"batch of {self.source_id!r}: shapes t_host_ns {self.t_host_ns.shape} and "
                f"values {self.values.shape} do not match"
            )
        for name, arr in (("t_raw", self.t_raw), ("flags", self.flags)):
            if arr is not None and arr.shape != (n,):
                raise UsageError(f"batch of {self.source_id!r}: {name} shape {arr.shape} != ({n},)")

    @property
    def n(self) -> int:
        return int(self.t_host_ns.shape[0])

    @property
    def last_seq(self) -> int:
        """The last sequence number this batch covers (several after coalescing)."""
        return self.seq if self.seq_last is None else self.seq_last


MARKER_KINDS = ("point", "begin", "end", "count")  # count: work done (``wattlab.count``)
MARKER_NAME_MAX = 128
MARKER_PAYLOAD_MAX = 2048


@dataclass(frozen=True)
class Marker:
    """A named instant or phase boundary from the workload, a device or the session."""

    t_host_ns: int
    name: str
    kind: str = "point"
    source: str = "workload"
    payload: dict[str, Any] = field(default_factory=dict)
    # when the GPU reached this point of its work, on the host clock (None: host time only)
    t_gpu_ns: int | None = None
    gpu_uncertainty_ns: int | None = None  # half-width of the host-GPU clock pairing used

    def __post_init__(self) -> None:
        if self.kind not in MARKER_KINDS:
            raise UsageError(f"marker kind {self.kind!r} is not one of {MARKER_KINDS}")
        if not self.name or len(self.name.encode()) > MARKER_NAME_MAX:
            raise UsageError(f"marker name must be 1-{MARKER_NAME_MAX} bytes, got {self.name!r}")
        if len(self.payload_json().encode()) > MARKER_PAYLOAD_MAX:
            raise UsageError(
                f"marker {self.name!r}: payload is over {MARKER_PAYLOAD_MAX} bytes as JSON"
            )

    def payload_json(self) -> str:
        try:
            return json.dumps(self.payload, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise UsageError(f"marker {self.name!r}: payload is not JSON-serialisable: {e}") from e


@dataclass(frozen=True)
class Gap:
    """Data that should exist but does not: lost batches, skipped bytes, a dead source."""

    source: str
    reason: str
    seq_first: int = -1
    seq_last: int = -1
    t_first_ns: int = -1
    t_last_ns: int = -1
    samples_lost: int = -1
