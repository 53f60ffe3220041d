"""Energy of a run: per stream and phase, fused NVML, counters, node split, summaries."""

from wattlab.analysis.energy.counter_shape import shape_source
from wattlab.analysis.energy.counter_ticks import COUNTER_UPDATE_S, at_updates
from wattlab.analysis.energy.node_energy import format_node_report, node_report
from wattlab.analysis.energy.run_summary import (
    GAP_FACTOR,
    SourceSummary,
    energy_channel,
    format_table,
    power_channel,
    summarise,
)
from wattlab.analysis.energy.source_energy import (
    Phase,
    corrected_energy,
    correction_terms,
    counter_energy,
    default_reference,
    energy_report,
    energy_streams,
    format_report,
    integrate_power,
    phases_from_markers,
    record_applies,
    span_verdict,
    stream_identity,
    windows_verdict,
)
from wattlab.analysis.energy.validity import (
    CHECKS,
    PROCESS_CHECK,
    combined_checks,
    device_identity,
    invalid_reasons,
    judge,
    process_stream_check,
)
from wattlab.analysis.energy.wiring_check import WiringMismatch, wiring_mismatches

__all__ = [
    "CHECKS",
    "COUNTER_UPDATE_S",
    "GAP_FACTOR",
    "PROCESS_CHECK",
    "Phase",
    "SourceSummary",
    "WiringMismatch",
    "at_updates",
    "combined_checks",
    "corrected_energy",
    "correction_terms",
    "counter_energy",
    "default_reference",
    "device_identity",
    "energy_channel",
    "energy_report",
    "energy_streams",
    "format_node_report",
    "format_report",
    "format_table",
    "integrate_power",
    "invalid_reasons",
    "judge",
    "node_report",
    "phases_from_markers",
    "power_channel",
    "process_stream_check",
    "record_applies",
    "shape_source",
    "span_verdict",
    "stream_identity",
    "summarise",
    "windows_verdict",
    "wiring_mismatches",
]
