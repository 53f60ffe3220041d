"""External meters, named on the command line (``--meter``) or in a bench file, and GPUs.

``--meter [ID=]KIND:ADDRESS``: KIND is a registered meter kind (see
:mod:`wattlab.acquisition.acquirers.meter_registry`): ``powersensor3`` (alias ``ps3``), ``pmd``,
``wt300e`` (aliases ``wt310e``, ``wt332e``, ``wt333e``), ``hmc8015``, ``mcp39f511``
(aliases ``mcp39f511n``, ``mcp``); ADDRESS is a
serial port or a VISA resource string (which contains colons itself, so only the first
colon splits). ID names the stream in the run file (default: the kind's usual name).

A bench file builds its meters through the same :func:`build_meter`, with options, and
may name the meter's rails and the GPU they feed: the stream's channels are then named
after the rails (``slot_12v_power_w``) and ``board_power_w`` (their sum) is added, with
the descriptor saying which GPU it feeds (:class:`RailAcquirer`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from wattlab.acquisition.acquirers import Acquirer, Chunk, Rail, Reading, amd_devices, meter_kinds
from wattlab.acquisition.meters.bench_file import NvmlChoice
from wattlab.errors import NvmlError, NvmlMissingError, UsageError, WattlabError
from wattlab.samples import Channel, SourceDescriptor, check_source_id

BOARD_POWER_CHANNEL = "board_power_w"


class RailAcquirer:
    """Wraps a meter: channels named after its rails, plus the board power of one GPU.

    Renaming only touches the descriptor; ``board_power_w`` is one column appended to each
    chunk, the sum of the named rails' power (so it is exactly the sum of the rail
    channels in the file). ``where`` (``bench.toml:12: device ps3``) prefixes every error.
    """

    def __init__(self, inner: Acquirer, source_id: str, rails: list[Rail], gpu: int | None,
                 where: str) -> None:
        self.inner = inner
        self.source_id = source_id
        self.rails = rails
        self.gpu = gpu
        self.where = where
        self._sum_columns: list[int] = []
        self._closed = False

    def open(self) -> list[SourceDescriptor]:
        """Open the meter and check that every rail is one of its measured inputs."""
        try:
            descriptors = self.inner.open()
        except WattlabError as e:
            raise type(e)(f"{self.where}: {e}") from e
        return [self._describe(d) if d.source_id == self.source_id else d for d in descriptors]

    def _describe(self, desc: SourceDescriptor) -> SourceDescriptor:
        names = desc.channel_names
        renames: dict[str, str] = {}
        rail_of: dict[str, str] = {}
        for rail in self.rails:
            missing = [old for old, _ in rail.renames if old not in names]
            if missing or not rail.renames:
                self.close()
                raise UsageError(f"{self.where}: rail {rail.name!r} is on {rail.input}, which "
                                 f"this {desc.model} does not measure (its channels: "
                                 f"{', '.join(names)})")
            renames.update(rail.renames)
            rail_of.update((old, rail.name) for old, _ in rail.renames)
        channels = [Channel(renames.get(c.name, c.name), c.unit,
                            f"{c.meaning} (rail {rail_of[c.name]})" if c.name in rail_of
                            else c.meaning) for c in desc.channels]
        config: dict[str, Any] = dict(desc.config)
        if self.rails:
            config["rails"] = {r.name: {"input": r.input, "channels": [n for _, n in r.renames]}
                               for r in self.rails}
        if self.gpu is not None:
            powered = [r.power_channel for r in self.rails if r.power_channel]
            if not powered:
                self.close()
                raise UsageError(f"{self.where}: gpu = {self.gpu}, but none of its rails "
                                 "measures power; name the rails that feed the GPU")
            self._sum_columns = [names.index(p) for p in powered]
            left_out = [c.name for c in desc.channels if c.unit == "W" and c.name not in powered
                        and c.name not in renames and c.name != "power_total_w"]
            if left_out:  # measured, but not named as a rail: not part of the board power
                config["not_in_board_power"] = left_out
                print(f"wattlab: {self.where}: {', '.join(left_out)} measured but not named in "
                      f"its rails, so not part of GPU {self.gpu}'s {BOARD_POWER_CHANNEL}",
                      file=sys.stderr)
            what = ", ".join(renames.get(p, p) for p in powered)
            channels.append(Channel(BOARD_POWER_CHANNEL, "W",
                                    f"board power of GPU {self.gpu}: {what}"))
            config.update({"feeds_gpu": self.gpu, "gpu_source": f"gpu{self.gpu}",
                           "board_power_channel": BOARD_POWER_CHANNEL,
                           "power_channel": BOARD_POWER_CHANNEL})
        config["bench_entry"] = self.where
        fields = {**desc.to_json(), "channels": [c.to_json() for c in channels],
                  "config": config}
        return SourceDescriptor.from_json(fields)

    def _map(self, readings: list[Reading]) -> list[Reading]:
        if not self._sum_columns:
            return readings
        out: list[Reading] = []
        for r in readings:
            if isinstance(r, Chunk) and r.source_id == self.source_id:
                board = r.values[:, self._sum_columns].sum(axis=1, keepdims=True,
                                                           dtype=r.values.dtype)
                out.append(Chunk(r.source_id, r.t_host_ns,
                                 np.concatenate([r.values, board], axis=1), r.t_raw, r.flags))
            else:
                out.append(r)
        return out

    def poll(self) -> list[Reading]:
        """The meter's readings, with the board power column added."""
        return self._map(self.inner.poll())

    def flush(self) -> list[Reading]:
        """What the meter held back at the end (nothing for meters that hold nothing)."""
        flush = getattr(self.inner, "flush", None)
        return self._map(flush()) if flush is not None else []

    def wake(self) -> None:
        """End the meter's sleep for a stop, where it sleeps longer than a poll (a GPU reader)."""
        wake = getattr(self.inner, "wake", None)
        if wake is not None:
            wake()

    def close(self) -> None:
        """Close the meter (once: a failed rail check already closed it)."""
        if not self._closed:
            self._closed = True
            self.inner.close()


def build_meter(kind: str, address: str, source_id: str,
                options: Mapping[str, Any] | None = None) -> Acquirer:
    """One meter's acquirer: the shared path of ``--meter`` and bench files.

    ``options`` are a bench entry's validated keys (the kind's defaults fill the rest);
    rails it names and ``gpu`` wrap the meter in a :class:`RailAcquirer`, ``where`` names
    the entry in errors.
    """
    registered = meter_kinds().get(kind)
    if registered is None:
        raise UsageError(f"unknown meter kind {kind!r}; known: {', '.join(METER_KINDS)}")
    opts = {**registered.defaults(), **(options or {})}
    inner: Acquirer = registered.build(address, source_id, opts)
    rails = registered.rails_of(opts)
    gpu = opts.get("gpu")
    if not rails and gpu is None and "where" not in opts:
        return inner
    return RailAcquirer(inner, source_id, rails, None if gpu is None else int(gpu),
                        str(opts.get("where", f"meter {source_id}")))


METER_KINDS: dict[str, str] = {k.kind: k.default_id for k in meter_kinds().values()}
ALIASES = {a: k.kind for k in meter_kinds().values() for a in k.aliases}


@dataclass(frozen=True)
class MeterSpec:
    """A parsed ``--meter`` argument."""

    source_id: str
    kind: str
    address: str

    def acquirer(self, options_json: str = "") -> Acquirer:
        """Build it; ``options_json`` carries a bench entry's options into a source process."""
        options = json.loads(options_json) if options_json else {}
        return build_meter(self.kind, self.address, self.source_id, options)


def parse_meter_spec(text: str) -> MeterSpec:
    """``[ID=]KIND:ADDRESS`` → MeterSpec, with an error that shows the expected shape."""
    source_id = ""
    rest = text
    if "=" in text.split(":", 1)[0]:
        source_id, rest = text.split("=", 1)
    kind, sep, address = rest.partition(":")
    kind = ALIASES.get(kind.lower(), kind.lower())
    if not sep or not address:
        raise UsageError(f"--meter {text!r}: expected [ID=]KIND:ADDRESS, "
                         f"e.g. powersensor3:/dev/ttyACM0")
    if kind not in METER_KINDS:
        raise UsageError(f"--meter {text!r}: unknown meter kind {kind!r}; "
                         f"known: {', '.join(sorted([*METER_KINDS, *ALIASES]))}")
    return MeterSpec(check_source_id(source_id or METER_KINDS[kind]), kind, address)


def check_unique_ids(ids: list[str], what: str = "--meter") -> None:
    """Two streams with one id would write into one group: refuse before anything opens."""
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise UsageError(f"{what}: stream id(s) {duplicates} used twice; name them ID=KIND:...")


def meter_acquirers(specs: list[str]) -> list[tuple[str, Acquirer]]:
    """Acquirers for every ``--meter``; stream ids must be unique."""
    parsed = [parse_meter_spec(s) for s in specs]
    check_unique_ids([p.source_id for p in parsed])
    return [(p.source_id, p.acquirer()) for p in parsed]


@contextmanager
def nvml_acquirers(choice: NvmlChoice, *, other_sources: bool = False
                   ) -> Iterator[list[tuple[str, Acquirer]]]:
    """NVML (or simulated) acquirers for the chosen GPUs; the library stays open.

    ``other_sources``: meters (or agents) are recorded as well, so with ``all`` GPUs (the
    default) a machine without the NVIDIA driver has none, said in one line, instead of an
    error; GPUs named by number, or nothing else to record, still need the driver.
    """
    if choice.gpus == "none":
        yield []
        return
    from wattlab.acquisition.acquirers import NvmlAcquirer, parse_intervals, parse_streams
    from wattlab.drivers.nvml import NvmlDriver

    parse_streams(choice.streams)  # a bad list fails before NVML is opened
    intervals_s = parse_intervals(choice.intervals)
    lib = None
    if choice.simulate:
        from wattlab.hardware.shared_gpu import simulated_nvml

        if choice.simulated_gpus < 1:
            raise UsageError("--simulated-gpus must be at least 1")
        lib = simulated_nvml(choice.simulated_gpus, choice.seed, choice.shared_processes)
    driver = NvmlDriver(lib)
    try:
        driver.open()
    except NvmlMissingError as e:
        if not (other_sources and choice.gpus == "all"):
            raise UsageError(str(e)) from e
        print(f"wattlab: no GPU found (no NVIDIA driver: {e.__cause__ or e}); recording "
              "without GPUs", file=sys.stderr)
        yield []
        return
    except NvmlError as e:
        raise UsageError(str(e)) from e
    try:
        indices = driver.resolve_gpus(choice.gpus)
        yield [(f"gpu{i}", NvmlAcquirer(driver, i, streams=choice.streams,
                                        intervals_s=intervals_s,
                                        process_cmdlines=choice.process_cmdlines))
               for i in indices]
    finally:
        driver.close()


def amd_acquirers(spec: str | None, options: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """One GPU reader per AMD GPU of ``--amd`` (none without it)."""
    if not spec or spec.strip().lower() == "none":
        return []
    return [(sid, build_meter("amd", address, sid, options))
            for sid, address in amd_devices(spec, options)]
