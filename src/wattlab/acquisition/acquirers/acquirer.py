"""What every acquirer provides (``open``/``poll``/``close``) and the readings it yields.

Why here and not beside the runner: meters, markers and sources all speak this protocol,
while only a session runs it; keeping it with the acquirers lets them stay below the session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from wattlab.samples import Gap, Marker, SourceDescriptor


@dataclass
class Chunk:
    """Samples an acquirer read, before the runner numbers them."""

    source_id: str
    t_host_ns: npt.NDArray[np.int64]
    values: npt.NDArray[Any]
    t_raw: npt.NDArray[Any] | None = None
    flags: npt.NDArray[np.uint8] | None = None


Reading = Chunk | Gap | Marker


class Acquirer(Protocol):
    """What a source must provide; ``poll`` blocks at most ~0.1 s so stopping is prompt.

    An acquirer that sleeps longer between reads (to wake less often) has a ``wake`` method,
    which the runner calls when it is asked to stop.
    """

    def open(self) -> list[SourceDescriptor]:
        """Connect to the instrument and describe every stream it will produce."""
        ...

    def poll(self) -> list[Reading]:
        """Return whatever was read since the last call (may be empty)."""
        ...

    def close(self) -> None:
        """Stop the instrument and release it; called once, also after errors."""
        ...


@runtime_checkable
class Flushable(Protocol):
    """An acquirer that batches rows between polls says so by having ``flush``."""

    def flush(self) -> list[Reading]:
        """Return every row still held back (called once, after the last poll)."""
        ...


def sleep_until_due(due_ns: int, step_s: float) -> bool:
    """Sleep toward ``due_ns`` (monotonic) by at most ``step_s``; True once a read is due.

    Why capped: a poll must come back often enough for its runner to see a stop request.
    """
    wait_s = (due_ns - time.monotonic_ns()) / 1e9
    if wait_s > 0:
        time.sleep(min(wait_s, step_s))
        if wait_s > step_s:
            return False
    return True
