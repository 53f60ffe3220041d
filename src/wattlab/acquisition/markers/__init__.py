"""Markers from the measured program and the GPU's own timeline (``wattlab.mark``/``phase``)."""
