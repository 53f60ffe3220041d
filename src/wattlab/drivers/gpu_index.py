"""What every GPU library driver shares: GPU lists and one session per host.

Why its own module: NVML and amdsmi both number their GPUs from 0 and ``--nvml`` and
``--amd`` take the same lists, so both drivers check a list the same way, with the same
messages; and both libraries are started once per process however many readers use them.
"""

from __future__ import annotations

import threading

from wattlab.errors import UsageError


def resolve_indices(spec: str, count: int, library: str = "NVML") -> list[int]:
    """``"all"`` or ``"0,2"`` → indices below ``count``, in the order given, each once."""
    text = spec.strip().lower()
    if text == "all":
        if count == 0:
            raise UsageError(f"no GPU found: {library} sees 0 GPUs")
        return list(range(count))
    indices: list[int] = []
    for part in text.split(","):
        token = part.strip()
        if not (token.isascii() and token.isdigit()):
            raise UsageError(
                f"GPU list {spec!r} is not valid: use 'all' or indices like '0' or '0,1'"
            )
        index = int(token)
        if index >= count:
            if count == 0:
                have = "this machine has no GPU"
            elif count == 1:
                have = "this machine has 1 GPU (index 0)"
            else:
                have = f"this machine has {count} GPUs (indices 0-{count - 1})"
            raise UsageError(f"GPU index {index} not found: {have}")
        if index not in indices:
            indices.append(index)
    return indices


class SharedSession:
    """A library session shared by every reader of a process, counted.

    The first ``open`` starts it, the last ``close`` stops it, and a ``close`` after a
    failed ``open`` does nothing. Drivers define ``_start`` and ``_stop`` and set
    ``_lock`` and ``_opened = 0``.
    """

    _lock: threading.Lock
    _opened: int

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def open(self) -> None:
        """Start the library on the first open; later opens are counted."""
        with self._lock:
            if self._opened == 0:
                self._start()
            self._opened += 1

    def close(self) -> None:
        """Stop the library once the last user is done."""
        with self._lock:
            if self._opened == 0:
                return
            self._opened -= 1
            if self._opened == 0:
                self._stop()
