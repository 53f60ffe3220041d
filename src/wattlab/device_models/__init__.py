"""Pure models of how devices behave: a driver's filter, a GPU's roofline, a device clock.

No I/O and no wattlab imports beyond errors: the simulators (``hardware``), the run-file writer
and the analysis share them, so each of those stays on its own layer.
"""

from wattlab.device_models.clock_fit import NOMINAL_NS_PER_UNIT, EnvelopeAccumulator
from wattlab.device_models.layer_physics import LayerPhysics
from wattlab.device_models.recursive_filter import first_order_filter
from wattlab.device_models.roofline import Roofline, measure_roofline, simulated_roofline
from wattlab.device_models.setting_response import SettingResponse
from wattlab.device_models.workload_schedule import Segment, WorkloadSchedule

__all__ = [
    "NOMINAL_NS_PER_UNIT",
    "EnvelopeAccumulator",
    "LayerPhysics",
    "Roofline",
    "Segment",
    "SettingResponse",
    "WorkloadSchedule",
    "first_order_filter",
    "measure_roofline",
    "simulated_roofline",
]
