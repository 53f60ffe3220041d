"""A validity verdict on every energy figure: named checks, each defined in docs/validity.md."""

from wattlab.analysis.energy.validity.figure_judge import judge
from wattlab.analysis.energy.validity.process_check import PROCESS_CHECK, process_stream_check
from wattlab.analysis.energy.validity.stream_checks import device_identity
from wattlab.analysis.energy.validity.time_scan import scan_times
from wattlab.analysis.energy.validity.verdict import CHECKS, combined_checks, invalid_reasons
from wattlab.analysis.energy.validity.window_check import clip_window

__all__ = [
    "CHECKS",
    "PROCESS_CHECK",
    "clip_window",
    "combined_checks",
    "device_identity",
    "invalid_reasons",
    "judge",
    "process_stream_check",
    "scan_times",
]
