"""How the driver's power reading relates to a reference: the fit and what it can tell."""

from wattlab.analysis.calibration.deconvolved_energy import Fusion, fuse_records, mark_breaks
from wattlab.analysis.calibration.delay_sign import lead_note
from wattlab.analysis.calibration.stream_calibration import (
    calibrate,
    load_record,
    store_in_run,
    target_updates,
    update_lattice,
)

__all__ = [
    "Fusion",
    "calibrate",
    "fuse_records",
    "lead_note",
    "load_record",
    "mark_breaks",
    "store_in_run",
    "target_updates",
    "update_lattice",
]
