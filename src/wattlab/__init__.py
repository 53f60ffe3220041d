"""wattlab: measure how much energy GPU work really takes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wattlab.acquisition.markers import mark, phase

if TYPE_CHECKING:
    from wattlab.analysis.run_file import Run

__version__ = "0.1.0"


def open(path: str) -> Run:  # mirrors h5py.File, shadows builtins.open on purpose
    """Open a run file (also one still being written) for reading."""
    from wattlab.analysis.run_file import Run

    return Run(path)


__all__ = ["__version__", "mark", "open", "phase"]
