"""Before recording: will the run fit on its disk.

Why an estimate and not a measurement: the check has to come before anything starts (a
refused run leaves no file). What the recorder writes is known well enough: every stream
costs one 512 KiB chunk per dataset as soon as it has a row, then its rows. Each stream's
rate is declared where the stream is made: a meter's in its registration
(``MeterKind.stream_rate``), NVML's in ``nvml_acquirer.STREAM_RATES``; they are what
``wattlab demo`` and the emulators wrote (rows per second and bytes per row, measured on a
run file), and a meter with more rails writes a little more per row.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from wattlab.acquisition.acquirers import NVML_STREAMS, StreamRate, meter_kinds
from wattlab.acquisition.acquirers import STREAM_RATES as NVML_RATES
from wattlab.errors import UsageError
from wattlab.runfile import CHUNK_BYTES, STREAM_DATASETS
from wattlab.sync.recorder import RESERVE_BYTES, room_bytes

MIB = 1 << 20
MINUTE_S = 60.0
DEFAULT_MIN_FREE_S = 300.0  # without a duration: warn below five minutes of data
FIXED_BYTES_PER_STREAM = len(STREAM_DATASETS) * CHUNK_BYTES  # one chunk per dataset, at once


@dataclass(frozen=True)
class DataRate:
    """What a set of streams writes: a fixed start-up cost, then bytes per second."""

    bytes_per_s: float
    fixed_bytes: int

    def bytes_for(self, seconds: float) -> float:
        return self.fixed_bytes + RESERVE_BYTES + self.bytes_per_s * seconds

    def seconds_in(self, free_bytes: float) -> float:
        left = free_bytes - self.fixed_bytes - RESERVE_BYTES
        return max(0.0, left / self.bytes_per_s) if self.bytes_per_s > 0 else float("inf")


def nvml_streams(gpus: int, streams: str) -> list[str]:
    """The NVML streams ``--nvml-streams`` asks for, once per GPU."""
    names = NVML_STREAMS if streams in ("", "all") else tuple(
        s.strip() for s in streams.split(",") if s.strip())
    return [f"nvml.{name}" for name in names] * gpus


def stream_rates() -> dict[str, StreamRate]:
    """Each stream kind's rate as its acquirer declared it: ``nvml.<stream>``, meter kinds."""
    return {**{f"nvml.{name}": rate for name, rate in NVML_RATES.items()},
            **{k.kind: k.stream_rate for k in meter_kinds().values() if k.stream_rate}}


def estimate(streams: list[str]) -> DataRate:
    """The data rate of these streams.

    Streams without a declared rate (an agent's, a meter's not measured) count only their
    chunks.
    """
    known = stream_rates()
    rates = [known[s] for s in streams if s in known]
    return DataRate(sum(r.rows_per_s * r.row_bytes for r in rates),
                    FIXED_BYTES_PER_STREAM * len(streams))


def free_bytes(output: str) -> int | None:
    """What may still be written beside ``output``: free space, and ``ulimit -f``.

    None: the folder is missing (the session says so itself).
    """
    try:
        return room_bytes(output)
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class SpaceVerdict:
    """``refuse`` (under a minute of data), ``warn`` or ``ok``, and the sentence why."""

    level: str
    message: str = ""


def judge(free: float, rate: DataRate, duration_s: float | None,
          min_free_mb: float | None) -> SpaceVerdict:
    """The decision, from numbers only (what the tests drive directly)."""
    start = rate.bytes_for(0.0)
    said = f"{free / MIB:.1f} MB free " + (
        f"is less than these sources need to start ({start / MIB:.1f} MB: a first chunk of "
        "every dataset and the reserve)" if free < start else
        f"holds about {duration_text(rate.seconds_in(free))} of these sources' data "
        f"({rate_text(rate.bytes_per_s)})")
    if free < rate.bytes_for(MINUTE_S):
        return SpaceVerdict("refuse", f"{said}; at least a minute is needed: free some space "
                                      "or record elsewhere (-o)")
    if duration_s is not None and free < rate.bytes_for(duration_s):
        return SpaceVerdict("warn", f"{said}, less than the {duration_s:g} s asked for: the "
                                    "recording will stop when the disk is full")
    wanted = (min_free_mb * MIB if min_free_mb is not None
              else rate.bytes_for(DEFAULT_MIN_FREE_S) if duration_s is None else 0.0)
    if free < wanted:
        return SpaceVerdict("warn", f"{said}; the recording will stop when the disk is full")
    return SpaceVerdict("ok")


def duration_text(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.0f} h"


def rate_text(bytes_per_s: float) -> str:
    if bytes_per_s >= MIB:
        return f"{bytes_per_s / MIB:.2f} MB/s"
    return f"{bytes_per_s / 1024:.1f} kB/s"


def check_room(output: str, streams: list[str], duration_s: float | None,
               min_free_mb: float | None) -> None:
    """Refuse (UsageError) a run that cannot hold a minute; warn on stderr when it is short."""
    if min_free_mb is not None and not 0 <= min_free_mb < float("inf"):
        raise UsageError(f"--min-free-mb must be a number >= 0, got {min_free_mb}")
    free = free_bytes(output)
    if free is None:
        return
    verdict = judge(free, estimate(streams), duration_s, min_free_mb)
    folder = os.path.dirname(os.path.abspath(output))
    if verdict.level == "refuse":
        raise UsageError(f"{folder}: {verdict.message}")
    if verdict.level == "warn":
        print(f"wattlab: warning: {folder}: {verdict.message}", file=sys.stderr)
