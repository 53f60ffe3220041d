"""Bench files: which GPUs and meters a bench has, in TOML, checked before a long run.

A bench file is written once per bench and reused for every recording
(`wattlab record --bench bench.toml`), so its mistakes must be found up front and named
precisely: file, line and key. tomllib gives no line numbers for keys, so they are found
by scanning the text for the table headers and ``key =`` lines.

Layout: an optional ``[bench]`` table (name, description) and one ``[[device]]`` table per
device with a ``kind``: nvml, powersensor3, pmd, wt300e, hmc8015.
"""

from __future__ import annotations

import difflib
import os
import re
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wattlab.errors import UsageError, WattlabError
from wattlab.samples import SOURCE_ID_PATTERN

Check = Callable[[Any], str | None]  # returns what is wrong, or None


def _string(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "must be a non-empty string"


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _positive_number(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return None if ok else "must be a number > 0"


def _non_negative_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else "must be a whole number >= 0"


def _positive_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return None if ok else "must be a whole number >= 1"


def _string_list(value: Any) -> str | None:
    ok = isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)
    return None if ok else "must be a non-empty list of strings"


def _elements(value: Any) -> str | None:
    ok = isinstance(value, list) and value and all(
        (isinstance(v, int) and not isinstance(v, bool) and v >= 1) or v == "SIGMA"
        for v in value)
    return None if ok else "must be a non-empty list of element numbers (1, 2, 3) or \"SIGMA\""


def _gpus(value: Any) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"all|\d+(\s*,\s*\d+)*", value.strip()):
        return None
    if isinstance(value, list) and value and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return "must be \"all\", a string like \"0,1\", or a list of GPU indices"


def _source_id(value: Any) -> str | None:
    if isinstance(value, str) and SOURCE_ID_PATTERN.match(value):
        return None
    return "must be 1-64 letters, digits, '_', '.', '-' (it names the stream in the run file)"


@dataclass(frozen=True)
class KindSchema:
    """Keys of one device kind: required ones, optional ones with defaults, checks."""

    required: dict[str, Check]
    optional: dict[str, tuple[Check, Any]]
    default_id: str
    help: str


COMMON: dict[str, tuple[Check, Any]] = {"note": (_string, "")}
KINDS: dict[str, KindSchema] = {
    "nvml": KindSchema({}, {"gpus": (_gpus, "all"), "simulate": (_bool, False),
                            "simulated_gpus": (_positive_int, 1),
                            "seed": (_non_negative_int, 0)},
                       "gpu", "GPUs read through NVML (source ids gpu<N>.*)"),
    "powersensor3": KindSchema({"port": _string}, {"id": (_source_id, "ps3")}, "ps3",
                               "PowerSensor3 on a USB serial port"),
    "pmd": KindSchema({"port": _string}, {"id": (_source_id, "pmd"),
                                          "baud": (_positive_int, None)}, "pmd",
                      "ElmorLabs PMD-USB on a USB serial port"),
    "wt300e": KindSchema({"resource": _string},
                         {"id": (_source_id, "wall"), "elements": (_elements, [1]),
                          "items": (_string_list, ["U", "I", "P"]),
                          "rate_s": (_positive_number, 0.1), "model": (_string, None)},
                         "wall", "Yokogawa WT300E series over VISA"),
    "hmc8015": KindSchema({"resource": _string},
                          {"id": (_source_id, "hmc"),
                           "functions": (_string_list, ["URMS", "IRMS", "P"]),
                           "rate_s": (_positive_number, 0.1), "auto_range": (_bool, True)},
                          "hmc", "Rohde & Schwarz HMC8015 over VISA"),
}
BENCH_KEYS: dict[str, Check] = {"name": _string, "description": _string}


@dataclass(frozen=True)
class DeviceConfig:
    """One ``[[device]]`` table, validated, with defaults filled in."""

    kind: str
    id: str
    line: int
    options: dict[str, Any]


@dataclass(frozen=True)
class BenchConfig:
    """A validated bench file."""

    path: str
    name: str
    description: str
    devices: list[DeviceConfig] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """What the recorder stores in the run's ``bench_config`` attribute."""
        return {"path": os.path.abspath(self.path), "name": self.name,
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
    return BenchConfig(path, str(bench.get("name", "")), str(bench.get("description", "")),
                       devices)


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
    known = ["kind", *schema.required, *schema.optional, *COMMON]
    options: dict[str, Any] = {}
    for key, value in table.items():
        if key == "kind":
            continue
        if key not in known:
            raise fail(lines.of("device", index, key), f"{where}: unknown key {key!r}"
                       + _suggest(key, known[1:]))
        check = schema.required.get(key) or {**schema.optional, **COMMON}[key][0]
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
    source_id = str(options.pop("id", schema.default_id))
    return DeviceConfig(kind, source_id, header, options)


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


def _nvml_acquirers(device: DeviceConfig) -> list[tuple[str, Any]]:
    from wattlab.acquisition.nvml_source import NvmlAcquirer
    from wattlab.drivers.nvml import NvmlDriver

    opts = device.options
    lib = None
    if opts.get("simulate"):
        from wattlab.hardware.fake_nvml import FakeNvml
        from wattlab.hardware.simulated_gpu import simulated_gpus

        lib = FakeNvml(simulated_gpus(int(opts["simulated_gpus"]), int(opts["seed"])))
    gpus = opts["gpus"]
    spec = ",".join(str(g) for g in gpus) if isinstance(gpus, list) else str(gpus)
    driver = NvmlDriver(lib)
    driver.open()  # counted: each acquirer opens and closes it again
    try:
        indices = driver.resolve_gpus(spec)
    finally:
        driver.close()
    return [(f"gpu{i}", NvmlAcquirer(driver, i)) for i in indices]


def _meter_acquirer(device: DeviceConfig) -> Any:
    opts = device.options
    if device.kind == "powersensor3":
        from wattlab.acquisition.powersensor3_source import PowerSensor3Acquirer

        return PowerSensor3Acquirer(opts["port"], device.id)
    if device.kind == "pmd":
        try:
            from wattlab.acquisition.pmd_source import PmdAcquirer
        except ImportError as e:
            raise UsageError(f"device {device.id!r} (line {device.line}): PMD-USB support is "
                             f"not in this installation ({e})") from e
        baud = opts.get("baud")
        return PmdAcquirer(opts["port"], device.id, baud=None if baud is None else int(baud))
    if device.kind == "wt300e":
        from wattlab.acquisition.scpi_sources import Wt300eAcquirer

        return Wt300eAcquirer(opts["resource"], device.id, elements=opts["elements"],
                              items=opts["items"], rate_s=float(opts["rate_s"]),
                              model=opts.get("model"))
    from wattlab.acquisition.scpi_sources import Hmc8015Acquirer

    return Hmc8015Acquirer(opts["resource"], device.id, functions=opts["functions"],
                           rate_s=float(opts["rate_s"]), auto_range=bool(opts["auto_range"]))


def device_acquirers(device: DeviceConfig) -> list[tuple[str, Any]]:
    """The acquirers of one device (several for an nvml device with several GPUs)."""
    if device.kind == "nvml":
        return _nvml_acquirers(device)
    return [(device.id, _meter_acquirer(device))]


def acquirers_from_bench(config: BenchConfig) -> list[tuple[str, Any]]:
    """(name, Acquirer) for every device, unopened, ready for ``Session(acquirers=...)``."""
    found: list[tuple[str, Any]] = []
    for device in config.devices:
        found += device_acquirers(device)
    return found


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
    from wattlab.acquisition.source import Chunk

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
        try:
            result.streams = [{"source_id": d.source_id, "model": d.model, "serial": d.serial,
                               "firmware": d.firmware, "transport": d.transport,
                               "channels": [f"{c.name} [{c.unit}]" for c in d.channels]}
                              for d in descriptors]
            result.first_values = _first_values(acquirer, descriptors, timeout_s)
            if not result.first_values:
                result.error = f"opened, but no reading within {timeout_s:g} s"
            else:
                result.ok = True
        finally:
            acquirer.close()
    except (WattlabError, OSError) as e:
        result.error = str(e)
    return result


def check_bench(config: BenchConfig, timeout_s: float = 3.0) -> list[DeviceCheck]:
    """Open every device in turn and report what it is and what it reads."""
    results = []
    for device in config.devices:
        try:
            acquirers = device_acquirers(device)
        except WattlabError as e:
            results.append(DeviceCheck(device.kind, device.id, device.line, False, error=str(e)))
            continue
        results += [check_device(name, acq, device, timeout_s) for name, acq in acquirers]
    return results


# ----------------------------------------------------------------------------- template

TEMPLATE = """\
# wattlab bench file: the GPUs and meters of one bench.
# Check it with `wattlab bench check bench.toml`; record with
# `wattlab record --bench bench.toml -- python train.py`.
# One [[device]] table per device; `kind` is one of:
#   nvml, powersensor3, pmd, wt300e, hmc8015.
# `id` names the device's stream in the run file (letters, digits, '_', '.', '-').

[bench]
name = "my-bench"
description = "GPU node with a riser sensor and a wall meter"

# GPUs through the NVIDIA driver (streams gpu<N>.samples, .power, .energy, .state).
[[device]]
kind = "nvml"
gpus = "all"            # "all", "0,1" or [0, 1]
# simulate = true       # a simulated GPU instead (no hardware needed)

# PowerSensor3 on the GPU's PCIe power (USB serial).
# [[device]]
# kind = "powersensor3"
# id = "ps3"
# port = "/dev/ttyACM0"

# ElmorLabs PMD-USB (USB serial).
# [[device]]
# kind = "pmd"
# id = "pmd"
# port = "/dev/ttyUSB0"

# Yokogawa WT310E / WT332E / WT333E at the wall (VISA resource).
# [[device]]
# kind = "wt300e"
# id = "wall"
# resource = "TCPIP::192.168.1.50::10001::SOCKET"
# elements = [1]
# items = ["U", "I", "P"]
# rate_s = 0.1          # update interval: 0.1, 0.25, 0.5, 1, 2, 5 s

# Rohde & Schwarz HMC8015 (VISA resource).
# [[device]]
# kind = "hmc8015"
# id = "hmc"
# resource = "TCPIP::192.168.1.51::5025::SOCKET"
# functions = ["URMS", "IRMS", "P"]
# rate_s = 0.1
"""


def write_template(path: str) -> None:
    """Write the commented template; never overwrites a file."""
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write(TEMPLATE)
    except FileExistsError as e:
        raise UsageError(f"{path}: already exists; not overwritten") from e
    except OSError as e:
        raise UsageError(f"{path}: cannot write: {e}") from e
