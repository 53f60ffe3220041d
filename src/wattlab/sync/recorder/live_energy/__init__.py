"""The recorder's live per-pod and per-job GPU energy (docs/fleet.md): split, series, routing.

Why a package of its own: four modules with one job together (Kepler's rule on the rows
the recorder already holds, the bounded pod/job series, the routing of streams to GPUs, a
MIG GPU's instances in place of its processes), which the exporter reads only through
these names.
"""

from wattlab.sync.recorder.live_energy.live_split import GpuLiveSplit
from wattlab.sync.recorder.live_energy.process_energy import LiveProcessEnergy
from wattlab.sync.recorder.live_energy.process_series import (
    GRACE_ENV,
    MAX_SERIES,
    ProcessFigures,
    ProcessSeries,
)

__all__ = ["GRACE_ENV", "MAX_SERIES", "GpuLiveSplit", "LiveProcessEnergy", "ProcessFigures",
           "ProcessSeries"]
