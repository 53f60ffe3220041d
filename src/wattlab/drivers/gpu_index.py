"""Turning ``all`` or ``0,2`` into GPU indices: one rule for every GPU library.

Why its own module: NVML and amdsmi both number their GPUs from 0 and ``--nvml`` and
``--amd`` take the same lists, so both drivers check a list the same way, with the same
messages.
"""

from __future__ import annotations

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
