"""Acquirers: one driver (or GPU library) wrapped to yield chunks, gaps and markers."""

from wattlab.acquisition.acquirers.acquirer import Acquirer, Chunk, Flushable, Reading
from wattlab.acquisition.acquirers.amd_acquirer import amd_devices, amd_options
from wattlab.acquisition.acquirers.meter_registry import MeterKind, Rail, StreamRate, meter_kinds
from wattlab.acquisition.acquirers.nvml_acquirer import (
    NVML_STREAMS,
    STREAM_RATES,
    NvmlAcquirer,
    parse_streams,
)
from wattlab.acquisition.acquirers.nvml_cadence import (
    DEFAULT_INTERVALS_S,
    FRUGAL_INTERVALS,
    MAX_DRAIN_S,
    parse_intervals,
)
from wattlab.acquisition.acquirers.powersensor3_acquirer import PowerSensor3Acquirer
from wattlab.acquisition.acquirers.scpi_acquirers import Wt300eAcquirer

__all__ = [
    "DEFAULT_INTERVALS_S",
    "FRUGAL_INTERVALS",
    "MAX_DRAIN_S",
    "NVML_STREAMS",
    "STREAM_RATES",
    "Acquirer",
    "Chunk",
    "Flushable",
    "MeterKind",
    "NvmlAcquirer",
    "PowerSensor3Acquirer",
    "Rail",
    "Reading",
    "StreamRate",
    "Wt300eAcquirer",
    "amd_devices",
    "amd_options",
    "meter_kinds",
    "parse_intervals",
    "parse_streams",
]
