"""Pure models of how devices behave: a driver's filter, a GPU's roofline, a device clock.

No I/O and no wattlab imports beyond errors: the simulators (``hardware``), the run-file writer
and the analysis share them, so each of those stays on its own layer.
"""
