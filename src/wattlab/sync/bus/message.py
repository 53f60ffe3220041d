"""Bus message format: ZeroMQ multipart ``[topic, header JSON, buffer, ...]``.

No pickle, ever: the header is JSON and arrays travel as raw little-endian buffers whose
dtype and shape the header declares. Every incoming message is validated here, so a
malformed one raises ``MalformedMessageError`` and the recorder carries on.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from wattlab.errors import MalformedMessageError
from wattlab.samples import (
    ALLOWED_TIME_RAW_DTYPES,
    ALLOWED_VALUE_DTYPES,
    Gap,
    Marker,
    SampleBatch,
    SourceDescriptor,
    check_source_id,
)

PROTOCOL_VERSION = 1
MAX_HEADER_BYTES = 65536
MAX_ROWS_PER_BATCH = 10_000_000
MAX_INT = 2**62  # every integer from the bus must fit the file's int64 columns, with room
MESSAGE_TYPES = ("descriptor", "batch", "marker", "gap", "end", "control", "reply", "clock")

BufferLike = bytes | memoryview | np.ndarray[Any, Any]


def _header(msg_type: str, source: str, **fields: Any) -> bytes:
    head = {"v": PROTOCOL_VERSION, "type": msg_type, "source": source, **fields}
    return json.dumps(head, separators=(",", ":"), allow_nan=False).encode()


def encode_descriptor(desc: SourceDescriptor) -> list[BufferLike]:
    return [desc.source_id.encode(), _header("descriptor", desc.source_id, body=desc.to_json())]


def encode_batch(batch: SampleBatch) -> list[BufferLike]:
    """Frames for a batch; arrays go as-is so ``send_multipart(copy=False)`` is zero-copy."""
    values = np.ascontiguousarray(batch.values)
    t_host = np.ascontiguousarray(batch.t_host_ns, dtype="<i8")
    arrays: list[tuple[str, np.ndarray[Any, Any]]] = [("t_host_ns", t_host), ("values", values)]
    if batch.t_raw is not None:
        arrays.append(("t_raw", np.ascontiguousarray(batch.t_raw)))
    if batch.flags is not None:
        arrays.append(("flags", np.ascontiguousarray(batch.flags, dtype="u1")))
    specs = [{"name": n, "dtype": a.dtype.str, "shape": list(a.shape)} for n, a in arrays]
    extra = {} if batch.seq_last is None else {"seq_last": batch.seq_last}
    head = _header("batch", batch.source_id, seq=batch.seq, n=batch.n, buffers=specs, **extra)
    return [batch.source_id.encode(), head, *(a for _, a in arrays)]


def encode_marker(marker: Marker) -> list[BufferLike]:
    body = {
        "t_host_ns": marker.t_host_ns,
        "name": marker.name,
        "kind": marker.kind,
        "payload": marker.payload,
    }
    if marker.t_gpu_ns is not None:
        body["t_gpu_ns"] = marker.t_gpu_ns
        body["gpu_uncertainty_ns"] = marker.gpu_uncertainty_ns
    return [b"marker", _header("marker", marker.source, body=body)]


def encode_gap(gap: Gap) -> list[BufferLike]:
    body = {
        "reason": gap.reason,
        "seq_first": gap.seq_first,
        "seq_last": gap.seq_last,
        "t_first_ns": gap.t_first_ns,
        "t_last_ns": gap.t_last_ns,
        "samples_lost": gap.samples_lost,
    }
    return [gap.source.encode(), _header("gap", gap.source, body=body)]


def encode_end(source_id: str, last_seq: int) -> list[BufferLike]:
    return [source_id.encode(), _header("end", source_id, last_seq=last_seq)]


def encode_control(command: str, **fields: Any) -> list[BufferLike]:
    return [b"control", _header("control", "control", command=command, **fields)]


def encode_reply(**fields: Any) -> list[BufferLike]:
    return [b"reply", _header("reply", "recorder", **fields)]


def encode_clock(host: str, **fields: Any) -> list[BufferLike]:
    """Clock-service traffic: hello, probe, probe reply, finish (see clock_service)."""
    return [b"clock", _header("clock", host, **fields)]


def decode_header(frames: list[Any]) -> dict[str, Any]:
    """Parse and check the envelope common to every message type."""
    if len(frames) < 2:
        raise MalformedMessageError(f"message has {len(frames)} frame(s), needs at least 2")
    raw = bytes(frames[1])
    if len(raw) > MAX_HEADER_BYTES:
        raise MalformedMessageError(f"header is {len(raw)} bytes, over {MAX_HEADER_BYTES}")
    try:
        head = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MalformedMessageError(f"header is not JSON: {e}") from e
    if not isinstance(head, dict):
        raise MalformedMessageError("header is not a JSON object")
    if head.get("v") != PROTOCOL_VERSION:
        raise MalformedMessageError(f"protocol version {head.get('v')!r}, expected 1")
    if head.get("type") not in MESSAGE_TYPES:
        raise MalformedMessageError(f"unknown message type {head.get('type')!r}")
    source = head.get("source")
    if not isinstance(source, str):
        raise MalformedMessageError("header field 'source' missing or not a string")
    if head["type"] in ("descriptor", "batch", "gap", "end", "clock"):
        try:
            check_source_id(source)
        except Exception as e:
            raise MalformedMessageError(str(e)) from e
    return head


def _int_field(head: dict[str, Any], name: str) -> int:
    value = head.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_INT:
        raise MalformedMessageError(f"header field {name!r} must be an integer in [0, 2**62)")
    return value


def _int64(value: Any, name: str, default: int | None = None) -> int:
    """An integer that fits an int64 column (the file), or the message is malformed."""
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not -MAX_INT < value < MAX_INT:
        raise MalformedMessageError(f"field {name!r} must be an integer within +-2**62, "
                                    f"got {str(value)[:40]!r}")
    return value


def decode_end(head: dict[str, Any]) -> int | None:
    """The last sequence number an ``end`` message names (None: not given)."""
    value = head.get("last_seq")
    return None if value is None else _int64(value, "last_seq")


_BATCH_BUFFER_DTYPES = {
    "t_host_ns": {"<i8": np.dtype("<i8")},
    "values": {d: np.dtype(d) for d in ALLOWED_VALUE_DTYPES},
    "t_raw": {d: np.dtype(d) for d in ALLOWED_TIME_RAW_DTYPES},
    "flags": {"|u1": np.dtype("u1")},
}


def _decode_buffer(spec: Any, frame: Any, n: int) -> tuple[str, np.ndarray[Any, Any]]:
    if not isinstance(spec, dict):
        raise MalformedMessageError("buffer spec is not an object")
    name, shape = spec.get("name"), spec.get("shape")
    dtypes = _BATCH_BUFFER_DTYPES.get(name) if isinstance(name, str) else None
    if name is None or dtypes is None:
        raise MalformedMessageError(f"unexpected buffer {name!r}")
    dtype = dtypes.get(str(spec.get("dtype")))
    if dtype is None:
        raise MalformedMessageError(f"buffer {name!r} has dtype {spec.get('dtype')!r}")
    if name == "values":
        if (not isinstance(shape, list) or len(shape) != 2 or shape[0] != n
                or not isinstance(shape[1], int) or shape[1] < 1):
            raise MalformedMessageError(f"values shape {shape!r} is not [{n}, channels]")
    elif shape != [n]:
        raise MalformedMessageError(f"buffer {name!r} shape {shape!r} != [{n}]")
    buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    expected = n * (shape[1] if name == "values" else 1) * dtype.itemsize
    if buf.nbytes != expected:
        raise MalformedMessageError(
            f"buffer {name!r} has {buf.nbytes} bytes, header says {expected}"
        )
    array = np.frombuffer(buf, dtype=dtype)
    return name, array.reshape(n, shape[1]) if name == "values" else array


def decode_batch(head: dict[str, Any], frames: list[Any]) -> SampleBatch:
    """Arrays are views on the received frames (no copy); every size is checked first."""
    seq = _int_field(head, "seq")
    seq_last = _int_field(head, "seq_last") if "seq_last" in head else None
    if seq_last is not None and seq_last < seq:
        raise MalformedMessageError(f"seq_last {seq_last} is before seq {seq}")
    n = _int_field(head, "n")
    if n > MAX_ROWS_PER_BATCH:
        raise MalformedMessageError(f"batch of {n} rows is over the limit {MAX_ROWS_PER_BATCH}")
    specs = head.get("buffers")
    if not isinstance(specs, list) or len(specs) != len(frames) - 2:
        raise MalformedMessageError("header 'buffers' does not match the number of frames")
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for spec, frame in zip(specs, frames[2:], strict=True):
        name, array = _decode_buffer(spec, frame, n)
        if name in arrays:
            raise MalformedMessageError(f"repeated buffer {name!r}")
        arrays[name] = array
    if "t_host_ns" not in arrays or "values" not in arrays:
        raise MalformedMessageError("batch lacks t_host_ns or values")
    return SampleBatch(
        source_id=head["source"],
        seq=seq,
        t_host_ns=arrays["t_host_ns"],
        values=arrays["values"],
        t_raw=arrays.get("t_raw"),
        flags=arrays.get("flags"),
        seq_last=seq_last,
    )


def decode_descriptor(head: dict[str, Any]) -> SourceDescriptor:
    body = head.get("body")
    if not isinstance(body, dict):
        raise MalformedMessageError("descriptor has no body")
    try:
        desc = SourceDescriptor.from_json(body)
    except Exception as e:
        raise MalformedMessageError(f"bad descriptor: {e}") from e
    if desc.source_id != head["source"]:
        raise MalformedMessageError("descriptor source id differs from the header's")
    return desc


def decode_marker(head: dict[str, Any]) -> Marker:
    body = head.get("body")
    if not isinstance(body, dict):
        raise MalformedMessageError("marker has no body")
    try:
        return Marker(
            t_host_ns=_int64(body["t_host_ns"], "t_host_ns"),
            name=str(body["name"]),
            kind=str(body.get("kind", "point")),
            source=head["source"],
            payload=dict(body.get("payload") or {}),
            t_gpu_ns=_optional_int64(body, "t_gpu_ns"),
            gpu_uncertainty_ns=_optional_int64(body, "gpu_uncertainty_ns"),
        )
    except Exception as e:
        raise MalformedMessageError(f"bad marker: {e}") from e


def _optional_int64(body: dict[str, Any], key: str) -> int | None:
    """A field newer senders add and older ones leave out."""
    return None if body.get(key) is None else _int64(body[key], key)


def decode_gap(head: dict[str, Any]) -> Gap:
    body = head.get("body")
    if not isinstance(body, dict):
        raise MalformedMessageError("gap has no body")
    try:
        return Gap(
            source=head["source"],
            reason=str(body["reason"])[:128],
            seq_first=_int64(body.get("seq_first"), "seq_first", -1),
            seq_last=_int64(body.get("seq_last"), "seq_last", -1),
            t_first_ns=_int64(body.get("t_first_ns"), "t_first_ns", -1),
            t_last_ns=_int64(body.get("t_last_ns"), "t_last_ns", -1),
            samples_lost=_int64(body.get("samples_lost"), "samples_lost", -1),
        )
    except Exception as e:
        raise MalformedMessageError(f"bad gap: {e}") from e
