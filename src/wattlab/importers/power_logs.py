"""Turn other tools' power logs into wattlab run files, so the same analysis applies to them.

Each reader parses one file into sources (absolute times in ns on the file's own clock) and
markers; ``import_files`` puts several files into one new run (never overwriting), one
source group per file (a file with several streams gets ``<name>.<stream>`` sources).
Malformed input raises ``RunFileError`` naming the file and line.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.errors import RunFileError, UsageError
from wattlab.runfile import RunFileWriter, schema
from wattlab.samples import Channel, Marker, SampleFlag, SourceDescriptor, check_source_id
from wattlab.version import __version__

TIME_UNITS_NS = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}
UNIT_SUFFIXES = {"w": "W", "j": "J", "v": "V", "a": "A", "mw": "mW", "kw": "kW", "mj": "mJ"}
TO_SI = {"mW": ("W", 1e-3), "kW": ("W", 1e3), "mJ": ("J", 1e-3), "MHz": ("Hz", 1e6),
         "kHz": ("Hz", 1e3), "GHz": ("Hz", 1e9), "mV": ("V", 1e-3), "mA": ("A", 1e-3)}
NVML_LEVELS = {0: "idle", 1: "half", 2: "full"}


@dataclass
class ImportedSource:
    """One stream read from a file: absolute times (ns, the file's clock) and SI values."""

    descriptor: SourceDescriptor
    t_ns: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    t_raw: npt.NDArray[Any] | None = None
    flags: npt.NDArray[np.uint8] | None = None


@dataclass
class Imported:
    """Everything one file held."""

    sources: list[ImportedSource]
    markers: list[Marker] = field(default_factory=list)


def safe_id(text: str) -> str:
    """A file stem or column name as a valid source/channel id."""
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]+", "_", text).strip("_.-") or "data"
    return cleaned[:64]


def to_si(unit: str, values: npt.NDArray[np.float64]) -> tuple[str, npt.NDArray[np.float64]]:
    """Convert mW, MHz, ... to W, Hz, ...; other units pass unchanged."""
    if unit in TO_SI:
        si, factor = TO_SI[unit]
        return si, values * factor
    return unit, values


def _descriptor(source_id: str, channels: list[Channel], path: Path, fmt: str, *,
                kind: str = "imported", model: str = "", time_raw: str = "file_time_ns",
                **config: Any) -> SourceDescriptor:
    return SourceDescriptor(
        source_id=check_source_id(source_id), kind=kind, model=model or fmt,
        channels=tuple(channels), transport=f"import:{fmt}", time_raw=time_raw,
        config={"imported_from": str(path), "import_format": fmt, **config},
    )


# --------------------------------------------------------------------------- NVML .npz


def _npz_arrays(path: Path) -> dict[str, npt.NDArray[Any]]:
    """Every array of an .npz archive; an empty file, a lone .npy or a pickle is refused."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # EOF: an empty file
        raise RunFileError(f"{path}: not a readable .npz file ({e})") from e
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise RunFileError(f"{path}: a single array (.npy), not an .npz archive of an NVML "
                           "capture's arrays")
    with data:
        try:
            return {k: np.asarray(data[k]) for k in data.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise RunFileError(f"{path}: not a readable .npz file ({e})") from e


def read_nvml_npz(path: Path, name: str) -> Imported:
    """The NVML capture format of ``h100_nvml_seed11.npz`` (see tests/data/README.md)."""
    arrays = _npz_arrays(path)
    missing = {"samples", "average", "meta"} - set(arrays)
    if missing:
        raise RunFileError(f"{path}: not an NVML capture: arrays {sorted(missing)} missing")
    try:
        meta = json.loads(str(arrays["meta"]))
    except json.JSONDecodeError as e:
        raise RunFileError(f"{path}: array 'meta' is not JSON ({e})") from e
    if not isinstance(meta, dict):
        raise RunFileError(f"{path}: array 'meta' is JSON but not an object "
                           f"({type(meta).__name__}); an NVML capture's meta is {{...}}")
    model = str(meta.get("gpu", "unknown GPU"))
    driver = str(meta.get("driver", ""))
    common = {"driver_version": driver, "board_part_number": str(meta.get("board", "")),
              "capture_meta": meta}
    views = [
        ("samples", "power_w", "W", 1e-3, "nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)"),
        ("instant", "instant_power_w", "W", 1e-3, "NVML_FI_DEV_POWER_INSTANT"),
        ("average", "average_power_w", "W", 1e-3, "nvmlDeviceGetPowerUsage"),
        ("energy", "energy_j", "J", 1e-3, "nvmlDeviceGetTotalEnergyConsumption"),
        ("sm_clock", "sm_clock_hz", "Hz", 1e6, "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)"),
    ]
    sources: list[ImportedSource] = []
    for key, channel, unit, scale, call in views:
        if key not in arrays:
            continue
        arr = arrays[key]
        if arr.ndim != 2 or arr.shape[1] < 2 or arr.shape[0] == 0:
            raise RunFileError(f"{path}: array {key!r} has shape {arr.shape}, expected n×2+ "
                               "with n >= 1")
        extra: dict[str, Any] = {"nvml_field": call}
        if key == "samples":  # GPU stamps (unix µs) are the sample times; keep them raw
            t_ns = arr[:, 0].astype(np.int64) * 1000
            t_raw: npt.NDArray[Any] = arr[:, 0].astype(np.int64)
            time_raw = "device_unix_us"
        else:
            t_ns = arr[:, 0].astype(np.int64)
            t_raw = t_ns.copy()
            time_raw = "host_realtime_ns"
            extra["rows"] = "only where the value changed"
        order = np.argsort(t_ns, kind="stable")
        desc = _descriptor(f"{name}.{key}", [Channel(channel, unit, call)], path, "nvml-npz",
                           kind="nvml", model=model, time_raw=time_raw, **common, **extra)
        desc = dataclasses.replace(desc, firmware=driver)
        sources.append(ImportedSource(desc, t_ns[order], (arr[order, 1:2] * scale).astype(
            np.float64), t_raw[order]))
    markers: list[Marker] = []
    if "load_edges" in arrays:
        edges = arrays["load_edges"]
        if edges.ndim != 2 or edges.shape[1] < 3:
            raise RunFileError(f"{path}: array 'load_edges' has shape {edges.shape}, "
                               "expected n×3")
        end_ns = max(int(s.t_ns[-1]) for s in sources)
        for i, (t0, level, seg) in enumerate(edges[:, :3].tolist()):
            t1 = int(edges[i + 1, 0]) if i + 1 < len(edges) else end_ns
            label = NVML_LEVELS.get(int(level), f"level{level}")
            payload = {"segment": int(seg), "level": int(level)}
            markers.append(Marker(int(t0), label, "begin", "load", payload))
            markers.append(Marker(t1, label, "end", "load", payload))
    return Imported(sources, markers)


# --------------------------------------------------------------------------- PMT logs


def read_pmt_log(path: Path, name: str) -> Imported:
    """PMT dumps: a header ``timestamp col…`` (s, W…), then rows; ``M t "text"`` are markers.

    Marker times are seconds since the first sample. "start"/"begin" and "end"/"stop"
    become begin/end of a phase named ``marked``; other texts become point markers.
    """
    rows: list[list[float]] = []
    marks: list[tuple[float, str, int]] = []
    header: list[str] | None = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if header is None:
                header = line.split()
                if len(header) < 2 or header[0].lower() not in ("timestamp", "time"):
                    raise RunFileError(f"{path}:{lineno}: expected a header 'timestamp "
                                       f"name…', got {line[:60]!r}")
                continue
            if line.startswith("M"):
                m = re.match(r'^M\s+([-+0-9.eE]+)\s*(?:"(.*)"|(\S.*))?$', line)
                if not m:
                    raise RunFileError(f"{path}:{lineno}: malformed marker line {line[:60]!r}")
                marks.append((float(m.group(1)), m.group(2) or m.group(3) or "mark", lineno))
                continue
            parts = line.split()
            if len(parts) != len(header):
                raise RunFileError(f"{path}:{lineno}: {len(parts)} fields, the header has "
                                   f"{len(header)}")
            try:
                rows.append([float(p) for p in parts])
            except ValueError as e:
                raise RunFileError(f"{path}:{lineno}: not a number ({e})") from e
    if header is None or not rows:
        raise RunFileError(f"{path}: no PMT header or no samples")
    data = np.array(rows)
    t_ns = np.round(data[:, 0] * 1e9).astype(np.int64)
    channels = [Channel(c if c.lower().endswith("_w") else f"{safe_id(c)}_w", "W",
                        f"PMT column {c}") for c in header[1:]]
    desc = _descriptor(name, channels, path, "pmt", model="PMT log")
    markers = []
    open_phase = False
    for t_rel, text, lineno in marks:
        t = int(t_ns[0] + round(t_rel * 1e9))
        low = text.lower()
        if low in ("start", "begin"):
            kind = "begin"
        elif low in ("end", "stop"):
            kind = "end"
        else:
            kind = "point"
        if kind == "end" and not open_phase:
            raise RunFileError(f"{path}:{lineno}: marker {text!r} ends no started phase")
        open_phase = kind == "begin" or (open_phase and kind == "point")
        markers.append(Marker(t, "marked" if kind != "point" else text[:128], kind, name,
                              {"text": text}))
    return Imported([ImportedSource(desc, t_ns, data[:, 1:], t_ns.copy())], markers)


# --------------------------------------------------------------------------- generic CSV


def column_unit(column: str, units: dict[str, str]) -> tuple[str, str] | None:
    """(channel name, unit) from ``--unit COL=U``, a ``[U]`` or a ``_u`` suffix, else None."""
    if column in units:
        return safe_id(column), units[column]
    m = re.match(r"^(.*?)\s*\[([^\]]+)\]\s*$", column)
    if m:
        unit = m.group(2).strip()
        return f"{safe_id(m.group(1))}_{safe_id(unit).lower()}", unit
    m = re.match(r"^.*_([A-Za-z]+)$", column)
    if m and m.group(1).lower() in UNIT_SUFFIXES:
        return safe_id(column), UNIT_SUFFIXES[m.group(1).lower()]
    return None


def _csv_header(reader: Iterator[list[str]], path: Path) -> list[str]:
    try:
        return [h.strip() for h in next(reader)]
    except StopIteration:
        raise RunFileError(f"{path}: empty file") from None


def _csv_rows(reader: Iterator[list[str]], width: int, path: Path
              ) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of the non-blank rows after the header, each ``width`` wide."""
    for lineno, parts in enumerate(reader, 2):
        if not parts or all(not p.strip() for p in parts):
            continue
        if len(parts) != width:
            raise RunFileError(f"{path}:{lineno}: {len(parts)} fields, the header has {width}")
        yield lineno, parts


def read_csv(path: Path, name: str, time_column: str | None = None, time_unit: str = "s",
             units: dict[str, str] | None = None) -> Imported:
    """A header row, a numeric time column (first unless named) and value columns with units."""
    if time_unit not in TIME_UNITS_NS:
        raise UsageError(f"--time-unit {time_unit!r}: use one of {sorted(TIME_UNITS_NS)}")
    units = units or {}
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f, skipinitialspace=True)
        header = _csv_header(reader, path)
        tcol = 0 if time_column is None else _index(header, time_column, path)
        value_cols = []
        for i, col in enumerate(header):
            if i == tcol:
                continue
            got = column_unit(col, units)
            if got is None:
                raise RunFileError(f"{path}:1: column {col!r} has no unit: name it "
                                   f"'{col}_w' / '{col} [W]' or pass --unit '{col}=W'")
            value_cols.append((i, *got))
        if not value_cols:
            raise RunFileError(f"{path}:1: no value columns besides the time column")
        times: list[float] = []
        rows: list[list[float]] = []
        for lineno, parts in _csv_rows(reader, len(header), path):
            try:
                times.append(float(parts[tcol]))
                rows.append([float(parts[i]) if parts[i].strip() else math.nan
                             for i, _, _ in value_cols])
            except ValueError as e:
                raise RunFileError(f"{path}:{lineno}: not a number ({e})") from e
    if not rows:
        raise RunFileError(f"{path}: no data rows")
    t_ns = np.round(np.array(times) * TIME_UNITS_NS[time_unit]).astype(np.int64)
    data = np.array(rows, dtype=np.float64)
    channels = []
    for j, (_, col_name, unit) in enumerate(value_cols):
        si, data[:, j] = to_si(unit, data[:, j])
        cname = col_name
        if si != unit:
            cname = re.sub(rf"_{re.escape(unit.lower())}$", "", cname) + f"_{si.lower()}"
        channels.append(Channel(cname, si, f"CSV column {header[value_cols[j][0]]}"))
    order = np.argsort(t_ns, kind="stable")
    desc = _descriptor(name, channels, path, "csv", time_unit=time_unit)
    return Imported([ImportedSource(desc, t_ns[order], data[order], t_ns[order])])


def _index(header: list[str], column: str, path: Path) -> int:
    if column in header:
        return header.index(column)
    raise UsageError(f"{path}: no column {column!r}; columns are {header}")


# --------------------------------------------------------------------------- nvidia-smi

SMI_ID_COLUMNS = ("index", "uuid", "pci.bus_id", "gpu_uuid", "gpu_bus_id")
SMI_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f")


def _smi_time_ns(text: str) -> int:
    for fmt in SMI_TIME_FORMATS:
        try:
            dt = datetime.strptime(text.strip(), fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
        return int(dt.timestamp()) * 1_000_000_000 + dt.microsecond * 1000
    raise ValueError(f"timestamp {text!r} is not in nvidia-smi's format")


def read_nvidia_smi(path: Path, name: str) -> Imported:
    """``nvidia-smi --query-gpu=timestamp,power.draw,… --format=csv`` (with its header).

    Numeric columns keep their bracketed unit (converted to SI); ``[N/A]`` becomes NaN;
    with an ``index``/``uuid`` column each GPU becomes its own source ``<name>.gpu<k>``.
    Timestamps are local wall-clock time without a zone: read as if UTC.
    """
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f, skipinitialspace=True)
        header = _csv_header(reader, path)
        if "timestamp" not in header:
            raise RunFileError(f"{path}:1: no 'timestamp' column: record with "
                               "--query-gpu=timestamp,power.draw --format=csv (with header)")
        tcol = header.index("timestamp")
        idcol = next((header.index(c) for c in SMI_ID_COLUMNS if c in header), None)
        numeric: list[tuple[int, str, str]] = []
        for i, col in enumerate(header):
            m = re.match(r"^([\w.]+)\s*(?:\[(.+)\])?$", col)
            if i in (tcol, idcol) or not m or (m.group(2) is None and col not in (
                    "temperature.gpu", "temperature.memory", "utilization.gpu")):
                continue
            numeric.append((i, m.group(1), (m.group(2) or "").strip()))
        if not numeric:
            raise RunFileError(f"{path}:1: no numeric columns with units (e.g. 'power.draw [W]')")
        per_gpu: dict[str, tuple[list[int], list[list[float]]]] = {}
        for lineno, parts in _csv_rows(reader, len(header), path):
            try:
                t = _smi_time_ns(parts[tcol])
                row = [_smi_number(parts[i]) for i, _, _ in numeric]
            except ValueError as e:
                raise RunFileError(f"{path}:{lineno}: {e}") from e
            key = parts[idcol].strip() if idcol is not None else ""
            ts, vals = per_gpu.setdefault(key, ([], []))
            ts.append(t)
            vals.append(row)
    if not per_gpu:
        raise RunFileError(f"{path}: no data rows")
    sources = []
    for k, (key, (ts, vals)) in enumerate(sorted(per_gpu.items())):
        data = np.array(vals, dtype=np.float64)
        channels = []
        for j, (_, col, unit) in enumerate(numeric):
            si, data[:, j] = to_si(unit or "1", data[:, j])
            suffix = {"W": "_w", "Hz": "_hz", "%": "_pct", "J": "_j"}.get(si, "")
            channels.append(Channel(safe_id(col.replace(".", "_")) + suffix, si,
                                    f"nvidia-smi {col}"))
        sid = name if len(per_gpu) == 1 else f"{name}.gpu{key if key.isdigit() else k}"
        t_ns = np.array(ts, dtype=np.int64)
        order = np.argsort(t_ns, kind="stable")
        desc = _descriptor(sid, channels, path, "nvidia-smi", kind="nvml",
                           model="nvidia-smi", gpu=key, nvml_field="nvmlDeviceGetPowerUsage")
        sources.append(ImportedSource(desc, t_ns[order], data[order], t_ns[order]))
    return Imported(sources)


def _smi_number(text: str) -> float:
    t = text.strip()
    if t in ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", ""):
        return math.nan
    return float(t.split()[0])


# --------------------------------------------------------------------------- PowerSensor3 psrun

PSRUN_FIXED = ("marker", "time", "dt_micro", "device_timestamp")
PSRUN_PAIR = re.compile(r"^(current|voltage|power)(\d+)$")
PSRUN_UNITS = {"current": ("a", "A"), "voltage": ("v", "V"), "power": ("w", "W")}
PSRUN_RANGE = re.compile(r'^M\s+(\S+)\s+(\S+)\s+(\S+)\s+"(.*)"\s*$')


def _psrun_header(fields: list[str], path: Path, lineno: int) -> list[Channel]:
    """Channels of a psrun header: (current, voltage, power) per active pair, then the total."""
    where = f"{path}:{lineno}"
    if tuple(fields[:4]) != PSRUN_FIXED or fields[-1:] != ["power_total"]:
        raise RunFileError(f"{where}: expected a PowerSensor3 dump header 'marker time "
                           f"dt_micro device_timestamp current0 voltage0 power0 … power_total', "
                           f"got {' '.join(fields)[:80]!r}")
    pair_cols = fields[4:-1]
    if len(pair_cols) % 3:
        raise RunFileError(f"{where}: {len(pair_cols)} pair columns, expected 3 per pair")
    channels: list[Channel] = []
    for k in range(0, len(pair_cols), 3):
        got = [PSRUN_PAIR.match(c) for c in pair_cols[k:k + 3]]
        pair = got[0].group(2) if got[0] else ""
        if [(m.group(1), m.group(2)) if m else None for m in got] != [
                (q, pair) for q in ("current", "voltage", "power")]:
            raise RunFileError(f"{where}: columns {pair_cols[k:k + 3]} are not "
                               "'currentN voltageN powerN'")
        for quantity in ("current", "voltage", "power"):
            suffix, unit = PSRUN_UNITS[quantity]
            channels.append(Channel(f"{quantity}{pair}_{suffix}", unit,
                                    f"psrun column {quantity}{pair}"))
    channels.append(Channel("power_total_w", "W", "psrun column power_total"))
    return channels


def read_psrun(path: Path, name: str) -> Imported:
    """A PowerSensor3 dump (``psrun -f FILE``, or ``PowerSensor::dump``) as one source.

    Layout (upstream host library ``PowerSensor.cc``, checked against its ``dump`` and
    ``dumpCurrentWattToFile``): a header ``marker time dt_micro device_timestamp``, then
    ``currentN voltageN powerN`` for each *active* pair N, then ``power_total``; one line
    ``S time dt_micro device_timestamp …`` per frame, where ``time`` is seconds since the
    sensor was opened (the file's own clock), ``dt_micro`` the µs since the previous line
    and ``device_timestamp`` the device's 10-bit µs counter (wraps every 1024 µs; kept as
    the raw time). Markers: ``M c`` (one character, written just before the frame the
    device marked: a point marker at that frame, which is also flagged MARKER), and
    ``M t0 t1 tag "name"`` (an interval in the same seconds: a begin/end phase ``name``).
    [unverified] Older host-library versions may differ (e.g. no header or other marker
    forms); lines starting with ``#`` are skipped.
    """
    channels: list[Channel] | None = None
    times: list[float] = []
    raw: list[int] = []
    rows: list[list[float]] = []
    marked: list[int] = []  # frame index each one-character marker applies to
    points: list[tuple[int, str]] = []
    ranges: list[tuple[float, float, str, str]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, text in enumerate(f, 1):
            line = text.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if channels is None:
                channels = _psrun_header(fields, path, lineno)
                continue
            if fields[0] == "S":
                if len(fields) != len(channels) + 4:
                    raise RunFileError(f"{path}:{lineno}: {len(fields)} fields, the header "
                                       f"has {len(channels) + 4}")
                try:
                    t = float(fields[1])
                    dev = int(fields[3])
                    values = [float(x) for x in fields[4:]]
                except ValueError as e:
                    raise RunFileError(f"{path}:{lineno}: not a number ({e})") from e
                if not math.isfinite(t) or (times and t < times[-1]):
                    raise RunFileError(f"{path}:{lineno}: time {fields[1]} s goes backwards "
                                       f"(previous {times[-1] if times else '-'} s)")
                times.append(t)
                raw.append(dev)
                rows.append(values)
            elif fields[0] == "M":
                if len(fields) == 2 and len(fields[1]) == 1:
                    points.append((len(times), fields[1]))
                    continue
                m = PSRUN_RANGE.match(line)
                try:
                    t0, t1 = (float(m.group(1)), float(m.group(2))) if m else (0.0, -1.0)
                except ValueError:
                    t0, t1 = 0.0, -1.0
                if m is None or not t0 <= t1:
                    raise RunFileError(f"{path}:{lineno}: malformed marker {line[:60]!r}: "
                                       "expected 'M c' or 'M t0 t1 tag \"name\"' (t0 ≤ t1)")
                ranges.append((t0, t1, m.group(3), m.group(4)))
            else:
                raise RunFileError(f"{path}:{lineno}: line starts with {fields[0][:20]!r}; "
                                   "a dump line starts with 'S' (sample) or 'M' (marker)")
    if channels is None or not rows:
        raise RunFileError(f"{path}: no PowerSensor3 dump header or no 'S' sample lines")
    t_ns = np.round(np.array(times) * 1e9).astype(np.int64)
    flags = np.zeros(t_ns.shape, np.uint8)
    markers: list[Marker] = []
    for frame, char in points:
        i = min(frame, len(times) - 1)
        marked.append(i)
        markers.append(Marker(int(t_ns[i]), char, "point", name, {"psrun_marker": char}))
    flags[marked] |= np.uint8(SampleFlag.MARKER)
    for t0, t1, tag, label in ranges:
        payload = {"tag": tag, "text": label}
        phase = label.strip()[:64] or f"tag{tag}"
        markers.append(Marker(round(t0 * 1e9), phase, "begin", name, payload))
        markers.append(Marker(round(t1 * 1e9), phase, "end", name, payload))
    desc = _descriptor(name, channels, path, "psrun", kind="powersensor3",
                       model="PowerSensor3", time_raw="device_us_mod1024",
                       time_note="'time' column: s since the sensor was opened")
    return Imported([ImportedSource(desc, t_ns, np.array(rows, dtype=np.float64),
                                    np.array(raw, dtype=np.int64), flags)], markers)


# --------------------------------------------------------------------------- the run file

READERS: dict[str, Callable[..., Imported]] = {
    "nvml-npz": read_nvml_npz,
    "pmt": read_pmt_log,
    "csv": read_csv,
    "nvidia-smi": read_nvidia_smi,
    "psrun": read_psrun,
}


def import_files(fmt: str, paths: list[str], output: str, names: list[str] | None = None,
                 *, command: list[str] | None = None,
                 readers: Mapping[str, Callable[..., Imported]] = READERS,
                 **options: Any) -> list[str]:
    """Read ``paths`` in format ``fmt`` into a new run file; returns the source ids written.

    ``names`` (one per file) replaces the file stems as source names; ``options`` go to the
    reader (CSV: ``time_column``, ``time_unit``, ``units``).
    """
    if fmt not in readers:
        raise UsageError(f"unknown import format {fmt!r}; formats are {sorted(readers)}")
    if not paths:
        raise UsageError("import needs at least one input file")
    if names is not None and len(names) != len(paths):
        raise UsageError(f"{len(names)} --source names for {len(paths)} files")
    imported: list[Imported] = []
    for i, p in enumerate(paths):
        path = Path(p)
        if not path.is_file():
            raise UsageError(f"{p}: no such file")
        name = check_source_id(names[i] if names else safe_id(path.stem))
        imported.append(readers[fmt](path, name, **options))
    sources = [s for imp in imported for s in imp.sources]
    ids = [s.descriptor.source_id for s in sources]
    if len(set(ids)) != len(ids):
        raise UsageError(f"two inputs give the same source names {ids}; use --source")
    start = min(int(s.t_ns[0]) for s in sources if s.t_ns.size)
    markers = [m for imp in imported for m in imp.markers]
    if markers:
        start = min(start, *(m.t_host_ns for m in markers))
    attrs = {
        schema.CREATED: datetime.now(UTC).isoformat(),
        schema.WATTLAB_VERSION: __version__,
        schema.COMMAND: json.dumps(command or ["wattlab", "import", fmt, *paths]),
        schema.IMPORTED_FROM: json.dumps([str(Path(p).resolve()) for p in paths]),
        schema.IMPORT_FORMAT: fmt,
        schema.HOST: "",
    }
    writer = RunFileWriter(output, attrs, start)
    try:
        for s in sources:
            writer.add_source(s.descriptor)
            raw = s.t_ns if s.t_raw is None else s.t_raw
            writer.append(s.descriptor.source_id, s.t_ns, raw.astype(
                np.dtype(s.descriptor.time_raw_dtype)), s.values.astype(
                np.dtype(s.descriptor.value_dtype)),
                s.flags if s.flags is not None else np.zeros(s.t_ns.shape, np.uint8))
        if markers:
            writer.add_markers(sorted(markers, key=lambda m: m.t_host_ns))
    finally:
        writer.close()
    return ids
