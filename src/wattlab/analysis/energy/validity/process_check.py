"""The check a per-process figure adds to its power stream's verdict: ``processes``.

Why a check of its own: a process's energy needs two streams, the power shared and the
per-process stream that says who ran; a gap in the second (the query failed mid-run)
leaves joules whose owner is unknown, however good the power stream is.
"""

from __future__ import annotations

from collections.abc import Sequence

from wattlab.analysis.energy.validity.verdict import Check, failed, passed

PROCESS_CHECK = "processes"


def process_stream_check(source: str, gaps: Sequence[str]) -> Check:
    """Passed where the per-process stream ``source`` has no gap, else failed naming them."""
    if not gaps:
        return passed(f"{source} has no gap")
    return failed(f"{source} has {len(gaps)} gap(s): " + "; ".join(gaps[:3])
                  + (" ..." if len(gaps) > 3 else "") + ": who ran then is unknown")
