"""The NVML reader's cadences, as users give them (``--nvml-intervals``, a bench file).

Its own small module, free of numpy and pynvml, because the CLI's help and the bench-file
check need it before (or without) any GPU code is loaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from wattlab.errors import UsageError

# "processes": the per-process utilisation while a GPU is shared; the driver answers one
# sample per process a call, its newest of ~6 a second, so a shorter interval sees more of
# them at ~1.9 ms of CPU a call on an H200. "mig": a MIG GPU's instances (GPM), on the
# power poll: at 0.9 s the simulated split's worst instance was 18 % off, at 0.09 s 1.4 %
# (docs/processes.md)
DEFAULT_INTERVALS_S = {"drain": 0.9, "power": 0.09, "energy": 9.0, "state": 0.9, "emit": 0.9,
                       "processes": 0.9, "mig": 0.09}
MIN_INTERVAL_S = 0.01  # shorter would spin: the driver's own samples come every 20 ms
# the driver keeps ~2.38 s of samples (H100 and H200, driver 580): a longer drain leaves
# under 0.38 s for a late wake-up before samples are lost
MAX_DRAIN_S = 2.0
MAX_INTERVAL_S = 3600.0  # longer is a typo; 1e308 s overflowed the ns conversion
# every driver sample at the least CPU (BENCHMARKS.md, "One-call drains, nanosecond CPU
# clocks, emit every 12 s"): the run file lags up to 12 s
FRUGAL_INTERVALS = "drain=1.8,emit=12,energy=60"


def parse_intervals(value: str | Mapping[str, Any]) -> dict[str, float]:
    """``"drain=1.8,emit=6"`` (or a mapping): the reader's cadences that differ from the defaults.

    Refused, naming the key: a name that is not a cadence, a value that is not a number of
    seconds from ``MIN_INTERVAL_S``, and a drain longer than ``MAX_DRAIN_S`` (samples lost).
    """
    if isinstance(value, str):
        pairs: list[tuple[str, Any]] = []
        for item in filter(None, (part.strip() for part in value.split(","))):
            key, sep, number = item.partition("=")
            if not sep:
                raise UsageError(f"NVML intervals {value!r}: {item!r} is not KEY=SECONDS")
            pairs.append((key.strip().lower(), number.strip()))
    else:
        pairs = list(value.items())
    out: dict[str, float] = {}
    for key, number in pairs:
        if key not in DEFAULT_INTERVALS_S:
            raise UsageError(f"NVML intervals: no cadence named {key!r}; the cadences are "
                             f"{', '.join(DEFAULT_INTERVALS_S)}")
        try:
            seconds = float(number)
        except (TypeError, ValueError):
            seconds = math.nan
        if isinstance(number, bool) or not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
            raise UsageError(f"NVML intervals: {key}={number} must be a number of seconds, "
                             f"at least {MIN_INTERVAL_S} and at most {MAX_INTERVAL_S:g}")
        if key == "drain" and seconds > MAX_DRAIN_S:
            raise UsageError(f"NVML intervals: drain={number} s is longer than {MAX_DRAIN_S} s; "
                             "the driver keeps ~2.38 s of samples, so a wake-up a little late "
                             "would lose some")
        out[key] = seconds
    return out
