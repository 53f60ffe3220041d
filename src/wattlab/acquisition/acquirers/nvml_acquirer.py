"""Acquirer for one GPU's NVML readings: five streams on their own cadences.

Why these streams: the NVML views of power differ in rate, window and lag (PROTOCOLS.md §7),
and calibration needs each as the driver gave it:

- ``gpu{i}.samples``: the driver's own 50 Hz buffer, with its unix-µs timestamps as raw time;
  drained every 0.9 s (it holds ~2.4 s: 119 samples on an H100, driver 580), without
  duplicates or loss. A Gap is emitted where the buffer came back full and its oldest sample
  is more than 1.5 periods after the last one seen (overflow), or where two samples are more
  than 3 periods apart (a hole), within a drain or across two. Not 1.5 periods alone: real
  stamps jitter up to ~46 ms.
- ``gpu{i}.power``: the instant field and the 1 s average, polled every 90 ms and kept as
  read; a reading equal to the previous one is flagged REPEAT so the ~100 ms update rhythm
  stays visible. 90 ms, just inside the update period: no update is missed, and the poll
  walks 10 ms through the update period each time, so calibration can place the updates
  to a few ms (polling at the update period itself would see each update at one fixed,
  unknown delay).
- ``gpu{i}.energy``: the energy counter, every 9 s and at the start and the end: a call
  costs ~4 ms of CPU on an H200 (more than all the other reads together), and the counter
  is cumulative, so reading it less often loses no energy, only time resolution.
- ``gpu{i}.state``: clocks, utilisation, temperature and power limit, every 0.9 s (five
  calls, ~0.2 ms of CPU together on an H200).
- ``gpu{i}.processes``: each process's utilisation samples and identity markers
  (process_stream.py, docs/processes.md), every 0.9 s (``processes``; with the state reads,
  no wake-up of its own unless set apart). On a MIG GPU,
  whose driver gives no per-process utilisation, ``gpu{i}.mig`` instead: each GPU
  instance's GPM activity (mig_stream.py).

Every cadence is a multiple of the 90 ms poll and they start together, so one wake-up serves
all the reads due: a wake-up costs far more CPU than the reads (caches are cold after a sleep: a
6 µs NVML call takes 100–150 µs then on an H200), and issue 10 asks for every driver sample at under
1 % of one core.

Readings the GPU does not support are left out (never zeros) and listed in ``config["missing"]``.
A recording can also ask for fewer streams (``--nvml-streams samples,energy``): without the
90 ms power poll the reader wakes about once a second, for users who want every driver
sample and the run's energy at the least CPU, and not the calibration views. Each cadence
can be changed (``--nvml-intervals``, ``nvml_cadence``): draining every 1.8 s and
sending every 12 s costs less again, at a smaller margin against a late wake-up and a run
file that lags further behind. Everything read, drained samples included, leaves at the
``emit`` cadence: one message per stream, one run-file write.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading
from wattlab.acquisition.acquirers.gpu_descriptors import describe_streams
from wattlab.acquisition.acquirers.meter_registry import StreamRate
from wattlab.acquisition.acquirers.mig_stream import MigReader, mig_reader
from wattlab.acquisition.acquirers.nvml_cadence import DEFAULT_INTERVALS_S
from wattlab.acquisition.acquirers.process_stream import ProcessReader
from wattlab.drivers.gpu_scope import GpuScope
from wattlab.drivers.nvml import NVML_CALLS
from wattlab.drivers.nvml_identity import DeviceInfo
from wattlab.errors import NvmlError, UsageError
from wattlab.samples import Gap, SampleFlag, SourceDescriptor

NVML_STREAMS = ("samples", "power", "energy", "state", "processes")
POWER_NAMES = ("instant_power_w", "average_power_w")  # what read_power returns, in order
STREAM_RATES = {  # what each stream writes for one GPU (a `wattlab demo` run file), per name
    "samples": StreamRate(50.0, 25),
    "power": StreamRate(11.1, 33),
    "energy": StreamRate(0.11, 25),
    "state": StreamRate(1.1, 57),
    "processes": StreamRate(12.0, 65),  # two busy processes, six samples a second each
}
SHORT_SLEEP_S = 0.1  # a stop waits at most this long for a sleep that ``wake`` cannot end

def energy_source(missing: Mapping[str, str], streams: Collection[str],
                  ids: Mapping[str, str], calls: Mapping[str, str] = NVML_CALLS) -> str:
    """Where this GPU's energy comes from: its counter, or which stream is integrated and why.

    Pre-Volta GPUs (and some vGPU guests) answer NOT_SUPPORTED for the energy counter; the
    energy is then the integral of the best power stream recorded, never 0 J. ``calls``
    names the driver's calls (NVML's or amdsmi's).
    """
    if "energy_j" not in missing and "energy" in streams:
        return f"counter: {ids['energy']}:energy_j ({calls['energy_j']})"
    why = (f"{calls['energy_j']} is not supported ({missing['energy_j']})"
           if "energy_j" in missing else "the energy stream was not recorded")
    for key, channel, call in (("samples", "power_w", "samples_power_w"),
                               ("power", "average_power_w", "average_power_w"),
                               ("power", "instant_power_w", "instant_power_w")):
        if call not in missing and key in streams:
            return f"integrated: {ids[key]}:{channel}, because {why}"
    return f"none: {why}, and no power stream was recorded"


def parse_streams(text: str | Collection[str]) -> tuple[str, ...]:
    """``"all"``, ``"samples,energy"`` or a list of names: the NVML streams to record, in order."""
    names = text.split(",") if isinstance(text, str) else list(text)
    names = [n.strip().lower() for n in names if n.strip()]
    if names == ["all"]:
        return NVML_STREAMS
    unknown = [n for n in names if n not in NVML_STREAMS]
    if unknown or not names:
        raise UsageError(f"NVML streams {text!r}: "
                         + (f"no stream named {unknown[0]!r}; " if unknown else "none given; ")
                         + f"give 'all' or a comma list of {', '.join(NVML_STREAMS)}")
    return tuple(n for n in NVML_STREAMS if n in names)


class GpuDriver(Protocol):
    """What the reader asks of a GPU driver (``NvmlDriver``, ``AmdSmiDriver``)."""

    @property
    def kind(self) -> str: ...
    @property
    def prefix(self) -> str: ...
    @property
    def calls(self) -> Mapping[str, str]: ...
    @property
    def state_names(self) -> tuple[str, ...]: ...

    def open(self) -> None: ...
    def close(self) -> None: ...
    def device_info(self, gpu: int) -> DeviceInfo: ...
    def probe(self, gpu: int) -> dict[str, str]: ...
    def scope(self, gpu: int, name: str) -> GpuScope: ...
    def energy_interval_cap_s(self, gpu: int) -> float | None: ...
    def counter_config(self, gpu: int) -> dict[str, Any]: ...
    def read_samples(self, gpu: int, last_seen_us: int
                     ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...
    def read_power(self, gpu: int) -> tuple[float | None, float | None]: ...
    def read_energy_j(self, gpu: int) -> float: ...
    def read_state(self, gpu: int) -> dict[str, float]: ...


class _Rows:
    """Rows read one at a time, sent as one Chunk every 0.9 s."""

    def __init__(self, source_id: str) -> None:
        self.source_id = source_id
        self.t_ns: list[int] = []
        self.values: list[list[float]] = []
        self.flags: list[int] = []
        self.prev: list[float] | None = None  # last row read, even if already sent

    def add(self, t_ns: int, values: list[float], flag: int) -> None:
        self.t_ns.append(t_ns)
        self.values.append(values)
        self.flags.append(flag)
        self.prev = values

    def take(self) -> Chunk | None:
        if not self.t_ns:
            return None
        chunk = Chunk(
            self.source_id,
            np.array(self.t_ns, dtype=np.int64),
            np.array(self.values, dtype=np.float64),
            flags=np.array(self.flags, dtype=np.uint8),
        )
        self.t_ns, self.values, self.flags = [], [], []
        return chunk


class NvmlAcquirer:
    """Reads GPU ``gpu_index`` through a GPU driver and yields Chunks for five streams.

    The driver is an ``NvmlDriver`` or an ``AmdSmiDriver``: its ``kind``, ``prefix``
    (streams ``gpu{i}.*`` or ``amd{i}.*``), ``calls`` and ``state_names`` say what is read;
    a driver without a sample buffer has no ``samples`` stream, and one whose energy
    counter wraps caps the ``energy`` cadence (``energy_interval_cap_s``).

    ``name`` replaces the streams' prefix (``amd0`` in ``amd0.power``), for a GPU named by
    the user. ``process_cmdlines`` puts command lines in the process markers.
    ``streams`` keeps only some of them (see ``parse_streams``); a stream left
    out is never read, so it costs no wake-up. ``intervals_s`` replaces some of
    ``DEFAULT_INTERVALS_S`` (checked user input comes from ``parse_intervals``; tests may go
    past its limits).

    ``clock_ns``, ``wall_clock_ns`` and ``sleep`` are injectable so tests can run on a fake
    clock; by default the clocks are ``time.monotonic_ns`` and ``time.time_ns``, and ``poll``
    sleeps until the next read is due unless ``wake`` is called: with fewer streams that can
    be seconds, and a stop must not wait for it.
    """

    def __init__(
        self,
        driver: GpuDriver,
        gpu_index: int,
        *,
        intervals_s: Mapping[str, float] | None = None,
        sample_period_s: float = 0.02,
        buffer_capacity: int = 120,
        streams: str | Collection[str] = NVML_STREAMS,
        name: str | None = None,
        process_cmdlines: bool = False,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        wall_clock_ns: Callable[[], int] = time.time_ns,
        sleep: Callable[[float], Any] | None = None,
    ) -> None:
        self.driver = driver
        self.gpu = gpu_index
        self.streams = parse_streams(streams)
        unknown = set(intervals_s or {}) - set(DEFAULT_INTERVALS_S)
        if unknown:
            raise ValueError(f"no NVML cadence named {sorted(unknown)[0]!r}")
        self.intervals_s = {**DEFAULT_INTERVALS_S, **(intervals_s or {})}
        self.sample_period_s = sample_period_s
        self.buffer_capacity = buffer_capacity
        self._clock = clock_ns
        self._wall = wall_clock_ns
        self._woken = threading.Event()
        self._sleep = sleep
        prefix = name or f"{driver.prefix}{gpu_index}"
        self.ids = {k: f"{prefix}.{k}" for k in NVML_STREAMS}
        self.process_cmdlines = process_cmdlines
        self._processes: ProcessReader | MigReader | None = None
        self.missing: dict[str, str] = {}
        self.descriptors: list[SourceDescriptor] = []
        self.unix_minus_monotonic_ns = 0
        self._opened = False
        self._due_ns: dict[str, int] = {}
        self._power_names: list[str] = []
        self._power_columns: list[int] = []  # which of read_power's two values are kept
        self._state_names: list[str] = []
        self._last_seen_us = 0
        self._seen_real_sample = False
        self._rows = {k: _Rows(self.ids[k]) for k in ("power", "energy", "state")}
        self._drained: list[Reading] = []  # samples (and their gaps) until the next emit

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> list[SourceDescriptor]:
        """Start NVML, learn what the GPU supports, describe the streams."""
        self.driver.open()
        self._opened = True
        self._woken.clear()
        try:
            info = self.driver.device_info(self.gpu)
            self.missing = {**info.missing, **self.driver.probe(self.gpu)}
            if not hasattr(self.driver, "read_processes"):
                self.missing["processes"] = f"{self.driver.kind} gives no per-process readings"
            scope = self.driver.scope(self.gpu, info.name)
            cap_s = self.driver.energy_interval_cap_s(self.gpu)
        except Exception:
            self.close()
            raise
        if cap_s is not None and self.intervals_s["energy"] > cap_s:
            self.intervals_s["energy"] = cap_s  # read before the counter can wrap twice
        calls = self.driver.calls
        self._power_names = [n for n in POWER_NAMES if n not in self.missing]
        self._power_columns = [POWER_NAMES.index(n) for n in self._power_names]
        self._state_names = [n for n in self.driver.state_names if n not in self.missing]
        self.unix_minus_monotonic_ns = self._wall() - self._clock()
        now = self._clock()
        self._last_seen_us = (now + self.unix_minus_monotonic_ns) // 1000  # nothing before open
        self._seen_real_sample = False
        self._drained = []
        mig = self._processes = (
            mig_reader(self.driver, self.gpu, self.ids["processes"].rsplit(".", 1)[0] + ".mig",
                       t_ns=now, missing=self.missing, cmdlines=self.process_cmdlines)
            if scope.mig and "processes" in self.streams and "processes" in self.missing
            else None)
        config: dict[str, Any] = {
            "gpu_index": self.gpu,
            "uuid": info.uuid,
            "board_part_number": info.board_part_number,
            "driver_version": info.driver_version,
            "nvml_version": info.nvml_version,
            "power_limit_range_w": [info.power_limit_min_w, info.power_limit_max_w],
            "power_limit_default_w": info.power_limit_default_w,
            "power_limit_w": info.power_limit_w,
            "missing": dict(self.missing),
            "intervals_s": dict(self.intervals_s),
            "streams": list(self.streams),
            "unix_minus_monotonic_ns": self.unix_minus_monotonic_ns,
            "scope": scope.to_json(),
            "energy_source": energy_source(self.missing, self.streams, self.ids, calls),
            **self.driver.counter_config(self.gpu),
        }
        described = describe_streams(
            self.driver.kind, calls, info, config, ids=self.ids, streams=self.streams,
            missing=self.missing, power_names=self._power_names,
            state_names=self._state_names, sample_period_s=self.sample_period_s,
            buffer_capacity=self.buffer_capacity)
        if mig is not None and described:
            described["processes"] = mig.describe(next(iter(described.values())))
        self.descriptors = list(described.values())
        if "processes" in described and mig is None:
            self._processes = ProcessReader(self.driver, self.gpu, self.ids["processes"],
                                            t_ns=now, cmdlines=self.process_cmdlines,
                                            unix_minus_monotonic_ns=self.unix_minus_monotonic_ns)
        for key in described:  # the drain first after a whole interval, the reads at once
            if key == "samples":
                self._due_ns["drain"] = now + round(self.intervals_s["drain"] * 1e9)
            else:
                self._due_ns[key] = now
        if not self.descriptors:
            self.close()
            raise NvmlError(f"GPU {self.gpu}: it supports none of the NVML streams asked for "
                            f"({', '.join(self.streams)}); NVML says {self.missing}")
        self._due_ns["emit"] = now + round(self.intervals_s["emit"] * 1e9)
        return list(self.descriptors)

    def _pause(self, wait_s: float) -> None:
        """Sleep; only a sleep longer than ``SHORT_SLEEP_S`` ends early on ``wake``.

        The 90 ms poll keeps a plain sleep, as it always had, also across a stop: after one,
        its reads stay in step with the counter's ticks (sweep windows depend on that).
        """
        if self._sleep is not None:
            self._sleep(wait_s)
        elif wait_s <= SHORT_SLEEP_S:
            time.sleep(wait_s)
        else:
            self._woken.wait(wait_s)

    def wake(self) -> None:
        """End the current and every later sleep of ``poll`` (the runner is stopping)."""
        self._woken.set()

    def close(self) -> None:
        """Release NVML (once)."""
        if self._opened:
            self._opened = False
            if isinstance(self._processes, MigReader):
                self._processes.close()
            self.driver.close()

    # ------------------------------------------------------------------ polling

    def poll(self) -> list[Reading]:
        """Sleep until the next read is due, then do what is due.

        No cap on the sleep: ``wake`` ends it for a stop, and a capped sleep would cost a
        wake-up for nothing whenever every cadence is longer than the cap.
        """
        if not self._opened:
            return []
        now = self._clock()
        wait_ns = min(self._due_ns.values()) - now
        if wait_ns > 0:
            self._pause(wait_ns * 1e-9)
            now = self._clock()
        for task in ("power", "energy", "state", "processes", "drain"):
            due = self._due_ns.get(task)
            if due is None or due > now:
                continue
            if task == "drain":
                self._drained += self._drain()
            elif task == "processes" and self._processes is not None:
                self._drained += self._processes.read(self._clock)
            else:
                getattr(self, f"_read_{task}")()
            self._reschedule(task, now)
        if self._due_ns["emit"] > now:
            return []  # what was read waits for the emit
        self._reschedule("emit", now)
        return self._take_rows()

    def flush(self) -> list[Reading]:
        """Everything still pending, with a final drain and a final energy reading.

        The counter is read at the start and at the end whatever its cadence, so the energy
        of even a short recording is exact from the counter.
        """
        if "energy" in self._due_ns:
            self._read_energy()
        if "drain" in self._due_ns:
            self._drained += self._drain()
        if self._processes is not None:
            self._drained += self._processes.read(self._clock)
            self._drained += self._processes.truth(self._clock())
        return self._take_rows()

    def _reschedule(self, task: str, now: int) -> None:
        cadence = "mig" if task == "processes" and isinstance(self._processes, MigReader) else task
        step = round(self.intervals_s[cadence] * 1e9)
        nxt = self._due_ns[task] + step
        self._due_ns[task] = nxt if nxt > now else now + step  # fell behind: skip, don't burst

    def _take_rows(self) -> list[Reading]:
        """Everything read since the last emit: one message per stream reaches the recorder.

        Drained samples wait for the emit too, so ``emit`` longer than ``drain`` means fewer
        messages and fewer run-file writes, not only fewer counter rows.
        """
        out, self._drained = self._drained, []
        return out + [c for c in (rows.take() for rows in self._rows.values()) if c is not None]

    def _timed(self, fn: Callable[[], Any]) -> tuple[int, Any]:
        """Call fn, stamping the middle of the call on the host clock."""
        t0 = self._clock()
        result = fn()
        return (t0 + self._clock()) // 2, result

    def _read_power(self) -> None:
        """The 90 ms poll: the most frequent read, so no closure or dict per call."""
        t0 = self._clock()
        instant_w, average_w = self.driver.read_power(self.gpu)
        t_ns = (t0 + self._clock()) // 2
        got = (np.nan if instant_w is None else instant_w,
               np.nan if average_w is None else average_w)  # in POWER_NAMES' order
        self._add("power", t_ns, [got[i] for i in self._power_columns])

    def _read_energy(self) -> None:
        t_ns, energy_j = self._timed(lambda: self.driver.read_energy_j(self.gpu))
        self._add("energy", t_ns, [energy_j])

    def _read_state(self) -> None:
        t_ns, state = self._timed(lambda: self.driver.read_state(self.gpu))
        row = [state.get(n, np.nan) for n in self._state_names]
        flag = SampleFlag.NO_DATA if len(state) < len(self._state_names) else SampleFlag.NONE
        self._rows["state"].add(t_ns, row, int(flag))

    def _add(self, key: str, t_ns: int, row: list[float]) -> None:
        """Add a row; REPEAT when every value equals the previous reading (no new update)."""
        rows = self._rows[key]
        previous = rows.prev
        flag = SampleFlag.NONE
        if any(math.isnan(v) for v in row):  # plain floats: no array per 20 ms reading
            flag |= SampleFlag.NO_DATA
        if previous is not None and previous == row:
            flag |= SampleFlag.REPEAT
        rows.add(t_ns, row, int(flag))

    def to_host_ns(self, unix_us: int) -> int:
        """A driver timestamp (unix µs) on the host monotonic clock, by the offset at open."""
        return unix_us * 1000 - self.unix_minus_monotonic_ns

    def _drain(self) -> list[Reading]:
        """Read the sample buffer past the last seen stamp; flag overflow and holes as Gaps."""
        stamps_us, power_w = self.driver.read_samples(self.gpu, self._last_seen_us)
        if stamps_us.shape[0] == 0:
            return []
        sid = self.ids["samples"]
        out: list[Reading] = []
        period_us = self.sample_period_s * 1e6
        before_us = np.concatenate(([self._last_seen_us], stamps_us[:-1]))
        dt_us = (stamps_us - before_us).astype(np.float64)
        full = stamps_us.shape[0] >= 0.9 * self.buffer_capacity
        overflow = full and dt_us[0] > 1.5 * period_us
        flagged = dt_us > 3 * period_us  # holes
        flagged[0] = (flagged[0] and self._seen_real_sample) or overflow  # first: no "before"
        for i in np.flatnonzero(flagged):
            out.append(Gap(sid, "NVML sample buffer overflowed: drained too late"
                           if i == 0 and overflow else "NVML sample buffer has a hole",
                           t_first_ns=self.to_host_ns(int(before_us[i])),
                           t_last_ns=self.to_host_ns(int(stamps_us[i])),
                           samples_lost=max(1, round(dt_us[i] / period_us) - 1)))
        self._last_seen_us = int(stamps_us[-1])
        self._seen_real_sample = True
        t_host = stamps_us * 1000 - self.unix_minus_monotonic_ns
        out.append(
            Chunk(
                sid,
                t_host.astype(np.int64),
                power_w.reshape(-1, 1),
                t_raw=stamps_us.astype(np.int64),
            )
        )
        return out
