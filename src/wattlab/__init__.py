"""wattlab: measure how much energy GPU work really takes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wattlab.acquisition.markers import count, mark, phase
    from wattlab.runfile import Run

from wattlab.version import __version__


def open(path: str) -> Run:  # mirrors h5py.File, shadows builtins.open on purpose
    """Open a run file (also one still being written) for reading."""
    from wattlab.runfile import Run

    return Run(path)


def __getattr__(name: str) -> Any:
    """``mark``, ``phase``, ``count`` load the bus (pyzmq) when used, not on ``import wattlab``."""
    if name in ("count", "mark", "phase"):
        from wattlab.acquisition.markers import program_markers as markers

        return getattr(markers, name)
    raise AttributeError(f"module 'wattlab' has no attribute {name!r}")


__all__ = ["__version__", "count", "mark", "open", "phase"]
