"""Whose joules were these: energy shared among activities by a stated rule, idle apart.

One core (``attribute``) for every split: per request, per unit of work, per process.
"""

from wattlab.analysis.attribution.by_process import ByProcess, ProcessEnergy, energy_by_process
from wattlab.analysis.attribution.by_request import (
    REQUEST_COLUMNS,
    REQUEST_RULES,
    ByRequest,
    RequestEnergy,
    energy_by_request,
    format_by_request,
    request_rows,
)
from wattlab.analysis.attribution.core import CLOSURE, Activity, Attribution, attribute
from wattlab.analysis.attribution.counters import (
    CounterSeries,
    find_counter,
    run_counters,
)
from wattlab.analysis.attribution.job_share import NOT_CHARGED, share_of_job
from wattlab.analysis.attribution.learn import fit_weights, measure_idle
from wattlab.analysis.attribution.per_unit import (
    PerUnit,
    UnitRow,
    energy_per_unit,
    format_per_unit,
)
from wattlab.analysis.attribution.power_stream import PowerStream, run_power_stream
from wattlab.analysis.attribution.process_view import (
    PROCESS_COLUMNS,
    by_process_json,
    format_by_process,
    process_rows,
)
from wattlab.analysis.attribution.request_log import (
    Request,
    RequestLog,
    parse_request_log,
    read_requests,
    write_requests,
)
from wattlab.analysis.attribution.rule import Param, Rule, equal_rule

__all__ = [
    "CLOSURE",
    "NOT_CHARGED",
    "PROCESS_COLUMNS",
    "REQUEST_COLUMNS", "REQUEST_RULES",
    "Activity",
    "Attribution",
    "ByProcess",
    "ByRequest",
    "CounterSeries",
    "Param",
    "PerUnit",
    "PowerStream",
    "ProcessEnergy",
    "Request",
    "RequestEnergy",
    "RequestLog",
    "Rule",
    "UnitRow",
    "attribute",
    "by_process_json",
    "energy_by_process",
    "energy_by_request",
    "energy_per_unit",
    "equal_rule",
    "find_counter",
    "fit_weights",
    "format_by_process",
    "format_by_request",
    "format_per_unit",
    "measure_idle",
    "parse_request_log",
    "process_rows",
    "read_requests",
    "request_rows",
    "run_counters",
    "run_power_stream",
    "share_of_job",
    "write_requests",
]
