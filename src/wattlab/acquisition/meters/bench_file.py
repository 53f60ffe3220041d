"""Bench files: which GPUs and meters a bench has, in TOML, checked before a long run.

A bench file is written once per bench and reused for every recording
(`wattlab record --bench bench.toml`), so its mistakes must be found up front and named
precisely: file, line and key. tomllib gives no line numbers for keys, so they are found
by scanning the text for the table headers and ``key =`` lines.

Layout: an optional ``[bench]`` table (name, description) and one ``[[device]]`` table per
device with a ``kind``: nvml, or a meter kind of :mod:`wattlab.acquisition.acquirers.meter_registry`
(powersensor3, pmd, wt300e, hmc8015, mcp39f511), whose keys come from its registration.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from wattlab.acquisition.acquirers import MeterKind, meter_kinds, parse_intervals
from wattlab.errors import UsageError, WattlabError
from wattlab.option_checks import Check
from wattlab.option_checks import bool_check as _bool
from wattlab.option_checks import non_negative_int as _non_negative_int
from wattlab.option_checks import positive_int as _positive_int
from wattlab.option_checks import source_id as _source_id
from wattlab.option_checks import string as _string


def _gpus(value: Any) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"all|\d+(\s*,\s*\d+)*", value.strip()):
        return None
    if isinstance(value, list) and value and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return "must be \"all\", a string like \"0,1\", or a list of GPU indices"


def _nvml_streams(value: Any) -> str | None:
    from wattlab.acquisition.acquirers import NVML_STREAMS, parse_streams

    rule = f"must be \"all\" or a list of {', '.join(NVML_STREAMS)}"
    if not (isinstance(value, str) or (isinstance(value, list) and all(
            isinstance(v, str) for v in value))):
        return rule
    try:
        parse_streams(value)
    except UsageError as e:
        return f"{rule} ({e})"
    return None


def _nvml_intervals(value: Any) -> str | None:
    rule = "must be a string like \"drain=1.8,emit=6\" or a table like {drain = 1.8}"
    if not isinstance(value, str | dict):
        return rule
    try:
        parse_intervals(value)
    except UsageError as e:
        return f"{rule} ({e})"
    return None


@dataclass(frozen=True)
class KindSchema:
    """Keys of one device kind: required ones, optional ones with defaults, checks."""

    required: dict[str, Check]
    optional: dict[str, tuple[Check, Any]]
    default_id: str
    help: str


COMMON: dict[str, tuple[Check, Any]] = {"note": (_string, "")}
METER_COMMON: dict[str, tuple[Check, Any]] = {"gpu": (_non_negative_int, None)}
KINDS: dict[str, KindSchema] = {
    "nvml": KindSchema({}, {"gpus": (_gpus, "all"), "simulate": (_bool, False),
                            "simulated_gpus": (_positive_int, 1),
                            "seed": (_non_negative_int, 0),
                            "streams": (_nvml_streams, "all"),
                            "intervals": (_nvml_intervals, "")},
                       "gpu", "GPUs read through NVML (source ids gpu<N>.*)"),
}


def _registered_schema(kind: MeterKind) -> KindSchema:
    """A registered meter's keys: its address, id, and the options it declares."""
    optional: dict[str, tuple[Check, Any]] = {"id": (_source_id, kind.default_id),
                                              **kind.options}
    return KindSchema({kind.address_key: _string}, optional, kind.default_id, kind.help)


KINDS.update({k.kind: _registered_schema(k) for k in meter_kinds().values()})
BENCH_KEYS: dict[str, Check] = {"name": _string, "description": _string}


@dataclass(frozen=True)
class DeviceConfig:
    """One ``[[device]]`` table, validated, with defaults filled in."""

    kind: str
    id: str
    line: int
    options: dict[str, Any]
    where: str = ""  # "bench.toml:12: device 'ps3' (powersensor3)", for errors at run time

    @property
    def address(self) -> str:
        """The serial port, VISA resource, folder (powercap) or URL of a meter: its kind's key.

        Why the kind's: a meter whose address key is none of the usual (``url`` of a scrape,
        a plugin's own) was built with an empty address.
        """
        kind = meter_kinds().get(self.kind)
        if kind is not None:
            return str(self.options.get(kind.address_key) or "")
        return str(self.options.get("port") or self.options.get("resource")
                   or self.options.get("path") or self.options.get("index") or "")


@dataclass(frozen=True)
class BenchConfig:
    """A validated bench file."""

    path: str
    name: str
    description: str
    devices: list[DeviceConfig] = field(default_factory=list)

    @property
    def nvml(self) -> DeviceConfig | None:
        """The one nvml device, if the bench reads GPUs."""
        return next((d for d in self.devices if d.kind == "nvml"), None)

    @property
    def meters(self) -> list[DeviceConfig]:
        return [d for d in self.devices if d.kind != "nvml"]

    def to_json(self) -> dict[str, Any]:
        """What the recorder stores in the run's ``bench_config`` attribute."""
        # a bench made by a command ("<qualify --gpu>") has no file: no directory to prefix
        path = self.path if self.path.startswith("<") else os.path.abspath(self.path)
        return {"path": path, "name": self.name,
                "description": self.description,
                "devices": [{"kind": d.kind, "id": d.id, **d.options} for d in self.devices]}


# ----------------------------------------------------------------------------- lines

_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_\-]+)\s*=")


class _Lines:
    """Line numbers of table headers and keys, found by scanning the text."""

    def __init__(self, text: str) -> None:
        self.headers: dict[tuple[str, int], int] = {}
        self.keys: dict[tuple[str, int, str], int] = {}
        counts: dict[str, int] = {}
        section, index = "", 0
        for number, line in enumerate(text.splitlines(), start=1):
            header = _HEADER.match(line)
            if header:
                section = header.group(2).strip().strip("\"'")
                index = counts.get(section, -1) + 1 if header.group(1) == "[[" else 0
                counts[section] = index
                self.headers[(section, index)] = number
                continue
            key = _KEY.match(line)
            if key:
                self.keys.setdefault((section, index, key.group(1).strip("\"'")), number)

    def of(self, section: str, index: int, key: str | None = None) -> int:
        if key is not None and (section, index, key) in self.keys:
            return self.keys[(section, index, key)]
        return self.headers.get((section, index), 1)


# ----------------------------------------------------------------------------- parsing


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(known)})"


def parse_bench(text: str, path: str = "<bench>") -> BenchConfig:
    """Validate a bench file's text; every error names file, line and key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from e
    lines = _Lines(text)

    def fail(line: int, message: str) -> UsageError:
        return UsageError(f"{path}:{line}: {message}")

    for key in data:
        if key not in ("bench", "device"):
            line = lines.keys.get(("", 0, key)) or lines.of(key, 0)
            raise fail(line, f"unknown table or key {key!r}" + _suggest(key, ["bench", "device"]))
    bench = data.get("bench", {})
    if not isinstance(bench, dict):
        raise fail(lines.of("", 0, "bench"), "'bench' must be a table: [bench]")
    for key, value in bench.items():
        if key not in BENCH_KEYS:
            raise fail(lines.of("bench", 0, key), f"[bench]: unknown key {key!r}"
                       + _suggest(key, list(BENCH_KEYS)))
        problem = BENCH_KEYS[key](value)
        if problem:
            raise fail(lines.of("bench", 0, key), f"[bench] {key} {problem}, got {value!r}")
    tables = data.get("device", [])
    if not isinstance(tables, list):
        raise fail(lines.of("device", 0), "devices are [[device]] tables (double brackets)")
    if not tables:
        raise UsageError(f"{path}: no [[device]] table: a bench needs at least one device")
    devices: list[DeviceConfig] = []
    seen: dict[str, int] = {}
    for index, table in enumerate(tables):
        device = _device(table, index, lines, fail)
        ids = ([device.id] if device.kind != "nvml" else [])
        for source_id in ids:
            if source_id in seen:
                raise fail(lines.of("device", index, "id"),
                           f"device {index + 1}: id {source_id!r} is already used by the "
                           f"device at line {seen[source_id]}")
            seen[source_id] = device.line
        devices.append(device)
    if sum(d.kind == "nvml" for d in devices) > 1:
        raise UsageError(f"{path}: more than one nvml device; list the GPUs in one: gpus = ...")
    devices = [DeviceConfig(d.kind, d.id, d.line, d.options,
                            f"{path}:{d.line}: device {d.id!r} ({d.kind})") for d in devices]
    _check_gpu_feeds(devices, lines, fail)
    return BenchConfig(path, str(bench.get("name", "")), str(bench.get("description", "")),
                       devices)


def _known_gpus(nvml: DeviceConfig) -> list[int] | None:
    """The GPU indices an nvml entry reads, where the file alone says (None: "all")."""
    gpus = nvml.options["gpus"]
    if isinstance(gpus, list):
        return list(gpus)
    if gpus.strip() != "all":
        return [int(g) for g in gpus.split(",")]
    return list(range(int(nvml.options["simulated_gpus"]))) if nvml.options["simulate"] else None


def _check_gpu_feeds(devices: list[DeviceConfig], lines: _Lines,
                     fail: Callable[[int, str], UsageError]) -> None:
    """Every ``gpu = N`` names a GPU the bench reads, and is fed by one meter only."""
    nvml = next((d for d in devices if d.kind == "nvml"), None)
    known = None if nvml is None else _known_gpus(nvml)
    fed: dict[int, DeviceConfig] = {}
    for index, device in enumerate(devices):
        gpu = device.options.get("gpu")
        if gpu is None:
            continue
        line = lines.of("device", index, "gpu")
        where = f"device {index + 1} ({device.kind})"
        if nvml is None:
            raise fail(line, f"{where}: gpu = {gpu}, but no [[device]] kind = \"nvml\" reads "
                             "GPUs; add one, or drop gpu")
        if known is not None and gpu not in known:
            raise fail(line, f"{where}: gpu = {gpu} is not one of the GPUs the nvml device "
                             f"at line {nvml.line} reads ({', '.join(map(str, known))})")
        if gpu in fed:
            raise fail(line, f"{where}: gpu {gpu} is already fed by device {fed[gpu].id!r} "
                             f"at line {fed[gpu].line}; one meter measures a GPU's board power")
        fed[gpu] = device


def check_gpus_exist(config: BenchConfig, gpus: list[tuple[str, Any]]) -> None:
    """Once NVML has said which GPUs exist (``gpu<N>`` names): each ``gpu = N`` is one."""
    indices = [int(name.removeprefix("gpu")) for name, _ in gpus]
    for device in config.meters:
        gpu = device.options.get("gpu")
        if gpu is not None and gpu not in indices:
            raise UsageError(f"{device.where}: gpu = {gpu}, but the GPUs read are "
                             f"{', '.join(map(str, indices)) or 'none'}")


def _device(table: dict[str, Any], index: int, lines: _Lines,
            fail: Callable[[int, str], UsageError]) -> DeviceConfig:
    where = f"device {index + 1}"
    header = lines.of("device", index)
    kind = table.get("kind")
    if kind is None:
        raise fail(header, f"{where}: no 'kind'; give one of {', '.join(KINDS)}")
    if kind not in KINDS:
        raise fail(lines.of("device", index, "kind"), f"{where}: unknown kind {kind!r}"
                   + _suggest(str(kind), list(KINDS)))
    schema = KINDS[kind]
    where = f"{where} ({kind})"
    common = COMMON if kind == "nvml" else {**COMMON, **METER_COMMON}
    known = ["kind", *schema.required, *schema.optional, *common]
    options: dict[str, Any] = {}
    for key, value in table.items():
        if key == "kind":
            continue
        if key not in known:
            raise fail(lines.of("device", index, key), f"{where}: unknown key {key!r}"
                       + _suggest(key, known[1:]))
        check = schema.required.get(key) or {**schema.optional, **common}[key][0]
        problem = check(value)
        if problem:
            raise fail(lines.of("device", index, key), f"{where}: {key} {problem}, "
                       f"got {value!r}")
        options[key] = value
    for key in schema.required:
        if key not in table:
            raise fail(header, f"{where}: missing key {key!r}")
    for key, (_, default) in schema.optional.items():
        if key not in options and default is not None:
            options[key] = default
    if "gpu" in options:
        problem = _board_problem(kind, options)
        if problem:
            raise fail(lines.of("device", index, "gpu"), f"{where}: gpu = {options['gpu']} "
                       f"{problem}")
    source_id = str(options.pop("id", schema.default_id))
    return DeviceConfig(kind, source_id, header, options)


def _board_problem(kind: str, options: dict[str, Any]) -> str | None:
    """Board power is the sum of named rails that measure power: say what is missing."""
    problem = meter_kinds()[kind].board_problem
    return None if problem is None else problem(options)


def load_bench(path: str) -> BenchConfig:
    """Read and validate a bench file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError as e:
        raise UsageError(f"{path}: no such bench file (make one with `wattlab bench init`)") \
            from e
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read bench file: {e}") from e
    return parse_bench(text, path)


# ----------------------------------------------------------------------------- acquirers


def meter_acquirer(device: DeviceConfig) -> Any:
    """A meter entry's acquirer, built as ``--meter`` builds one, with the entry's options."""
    from wattlab.acquisition.meters.meter_specs import build_meter

    return build_meter(device.kind, device.address, device.id,
                       {**device.options, "where": device.where})


def meter_options_json(device: DeviceConfig) -> str:
    """A meter entry's options for a source process (rebuilt there by ``build_meter``)."""
    return json.dumps({**device.options, "where": device.where})


@dataclass(frozen=True)
class NvmlChoice:
    """Which GPUs to read and how, as ``record``'s flags or a bench file's nvml entry say."""

    gpus: str = "all"  # "all", "0,1" or "none"
    simulate: bool = False
    simulated_gpus: int = 1
    seed: int = 0
    streams: str = "all"  # --nvml-streams
    intervals: str = ""  # --nvml-intervals: cadences that differ from the defaults
    shared_processes: int = 0  # --shared-processes: simulated processes sharing each GPU
    process_cmdlines: bool = False  # --process-cmdlines: other users' command lines too


def nvml_selection(config: BenchConfig) -> NvmlChoice:
    """The bench file's nvml entry as ``record``'s flags would say it (none: no GPU)."""
    nvml = config.nvml
    if nvml is None:
        return NvmlChoice("none")
    gpus = nvml.options["gpus"]
    spec = ",".join(str(g) for g in gpus) if isinstance(gpus, list) else str(gpus)
    streams = nvml.options["streams"]
    intervals = nvml.options["intervals"]
    if isinstance(intervals, dict):
        intervals = ",".join(f"{k}={v}" for k, v in intervals.items())
    return NvmlChoice(spec, bool(nvml.options["simulate"]), int(nvml.options["simulated_gpus"]),
                      int(nvml.options["seed"]),
                      streams if isinstance(streams, str) else ",".join(streams), intervals)


@contextmanager
def bench_acquirers(config: BenchConfig) -> Iterator[list[tuple[str, Any]]]:
    """(name, Acquirer) for every device, unopened, ready for ``Session(acquirers=...)``.

    NVML stays open while the context is; GPUs named by ``gpu = N`` are checked here,
    once NVML has said which exist.
    """
    from wattlab.acquisition.meters.meter_specs import nvml_acquirers

    with nvml_acquirers(nvml_selection(config)) as gpus:
        check_gpus_exist(config, gpus)
        yield gpus + [(d.id, meter_acquirer(d)) for d in config.meters]


# ----------------------------------------------------------------------------- check


@dataclass
class DeviceCheck:
    """What `bench check` found at one device: identity, streams, a first reading."""

    kind: str
    name: str
    line: int
    ok: bool
    streams: list[dict[str, Any]] = field(default_factory=list)
    first_values: dict[str, float] = field(default_factory=dict)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _first_values(acquirer: Any, descriptors: list[Any], timeout_s: float) -> dict[str, float]:
    from wattlab.acquisition.acquirers import Chunk

    names = {d.source_id: d.channel_names for d in descriptors}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for reading in acquirer.poll():
            if isinstance(reading, Chunk) and len(reading.t_host_ns):
                row = reading.values[-1]
                return {f"{reading.source_id}:{n}": float(v)
                        for n, v in zip(names.get(reading.source_id, []), row, strict=False)}
    return {}


def check_device(name: str, acquirer: Any, device: DeviceConfig,
                 timeout_s: float = 3.0) -> DeviceCheck:
    """Open one acquirer, describe its streams, wait for one reading, close it."""
    result = DeviceCheck(device.kind, name, device.line, ok=False)
    try:
        descriptors = acquirer.open()
        result.streams = [{"source_id": d.source_id, "model": d.model, "serial": d.serial,
                           "firmware": d.firmware, "transport": d.transport,
                           "channels": [f"{c.name} [{c.unit}]" for c in d.channels],
                           **{k: d.config[k] for k in ("rails", "feeds_gpu") if k in d.config}}
                          for d in descriptors]
        result.first_values = _first_values(acquirer, descriptors, timeout_s)
        if not result.first_values:
            result.error = f"opened, but no reading within {timeout_s:g} s"
        else:
            result.ok = True
    except (WattlabError, OSError) as e:
        result.error = str(e)
    finally:
        try:
            acquirer.close()  # also after a failed open: a half-open port is released
        except (WattlabError, OSError) as e:
            result.error = result.error or f"close failed: {e}"
    return result


def check_bench(config: BenchConfig, timeout_s: float = 3.0) -> list[DeviceCheck]:
    """Open every device in turn and report what it is and what it reads."""
    from wattlab.acquisition.meters.meter_specs import nvml_acquirers

    results: list[DeviceCheck] = []
    nvml = config.nvml
    if nvml is not None:
        try:
            with nvml_acquirers(nvml_selection(config)) as gpus:
                check_gpus_exist(config, gpus)
                results += [check_device(name, acq, nvml, timeout_s) for name, acq in gpus]
        except WattlabError as e:
            results.append(DeviceCheck(nvml.kind, "gpus", nvml.line, False, error=str(e)))
    for device in config.meters:
        try:
            acquirer = meter_acquirer(device)
        except WattlabError as e:
            results.append(DeviceCheck(device.kind, device.id, device.line, False, error=str(e)))
            continue
        results.append(check_device(device.id, acquirer, device, timeout_s))
    return results


# ----------------------------------------------------------------------------- template

TEMPLATE = """\
# wattlab bench file: the GPUs and meters of one bench.
# Check it with `wattlab bench check bench.toml` (opens every device and shows a first
# reading); record with `wattlab record --bench bench.toml -- python train.py`.
# One [[device]] table per device; `kind` is nvml or one of the meters below.
# `id` names the device's stream in the run file (letters, digits, '_', '.', '-').
#
# Rails: a meter may name what each of its inputs measures, and `gpu = N` says that
# those rails together feed GPU N. The run file then has channels named after the rails
# (slot_12v_power_w, slot_12v_voltage_v, slot_12v_current_a, ...) and board_power_w, their
# sum, marked as GPU N's board power so analysis pairs it with the gpuN.* streams.
# Rail names: 1-32 lower-case letters, digits and '_' (e.g. slot_12v, slot_3v3,
# cable_8pin_1, cable_12vhpwr, wall). Each GPU is fed by at most one meter.

[bench]
name = "my-bench"
description = "GPU node with a riser sensor and a wall meter"

# GPUs through the NVIDIA driver (streams gpu<N>.samples, .power, .energy, .state).
[[device]]
kind = "nvml"
gpus = "all"            # "all", "0,1" or [0, 1]
# simulate = true       # a simulated GPU instead (no hardware needed)
# simulated_gpus = 1
# seed = 0
# streams = ["samples", "energy"]  # fewer streams, less CPU (default "all")
# intervals = { drain = 1.8, emit = 12, energy = 60 }  # rarer reads, less CPU again
""" + "".join(k.template for k in meter_kinds().values())


def write_template(path: str) -> None:
    """Write the commented template; never overwrites a file."""
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write(TEMPLATE)
    except FileExistsError as e:
        raise UsageError(f"{path}: already exists; not overwritten") from e
    except OSError as e:
        raise UsageError(f"{path}: cannot write: {e}") from e
