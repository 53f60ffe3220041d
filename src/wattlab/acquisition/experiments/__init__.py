"""Runs that drive the GPU on purpose: sweeps over settings, the calibration telegraph load."""
