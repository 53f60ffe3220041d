"""MLPerf-style meter qualification: idle and two loads, Olympic-scored window means."""

from wattlab.analysis.qualify.levels import LEVELS, SETTLE_S
from wattlab.analysis.qualify.olympic import WINDOWS_PER_LEVEL, check_windows, olympic_mean
from wattlab.analysis.qualify.scope import parse_measures, reference_meaning, reference_stream
from wattlab.analysis.qualify.verdict import (
    DEFAULT_MAX_PCT,
    FINE_WINDOWS_S,
    MLPERF_WINDOW_S,
    SHORT_WINDOW_S,
    Procedure,
    TargetVerdict,
    qualify,
)

__all__ = ["DEFAULT_MAX_PCT", "FINE_WINDOWS_S", "LEVELS", "MLPERF_WINDOW_S", "SETTLE_S",
           "SHORT_WINDOW_S", "WINDOWS_PER_LEVEL", "Procedure", "TargetVerdict",
           "check_windows", "olympic_mean", "parse_measures", "qualify", "reference_meaning",
           "reference_stream"]
