"""Runs that drive the GPU on purpose: sweeps over settings, the calibration telegraph load."""

from wattlab.acquisition.experiments.sweep_runner import (
    KNOB_LABELS,
    RunResult,
    SettingsGuard,
    SweepPlan,
    open_driver,
    parse_settings,
    run_sweep,
    runs_folder,
)
from wattlab.acquisition.experiments.telegraph_schedule import seconds_for, telegraph

__all__ = [
    "KNOB_LABELS",
    "RunResult",
    "SettingsGuard",
    "SweepPlan",
    "open_driver",
    "parse_settings",
    "run_sweep",
    "runs_folder",
    "seconds_for",
    "telegraph",
]
