"""Markers from the measured program and the GPU's own timeline (``wattlab.mark``/``phase``)."""

from wattlab.acquisition.markers.program_markers import (
    BUS_ENV,
    count,
    mark,
    phase,
    take_stamp,
)

__all__ = [
    "BUS_ENV",
    "count",
    "mark",
    "phase",
    "take_stamp",
]
