"""No silent zero: a counter that gives nothing is said, and its GPU's integral stands in.

Why: a GPU without an energy counter (pre-Volta, some vGPU guests) or a counter that reads
0 J used to be summed as 0 J into a total. A counter row that reports 0 J (or nothing)
while the same device drew power fails; where the recorder found no counter on a GPU
(``config.energy_source``), each of its integrated figures passes and says it stands in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from wattlab.analysis.energy.validity.stream_checks import device_identity
from wattlab.analysis.energy.validity.verdict import Check, failed, not_applicable, passed
from wattlab.runfile import Run

if TYPE_CHECKING:
    from wattlab.analysis.energy.source_energy import EnergyRow

ZERO_J = 1e-9
MOVED = passed("the counter moved")
NOT_A_COUNTER = not_applicable("not an energy counter's figure")


def no_silent_zero(run: Run, row: EnergyRow, phase_rows: Sequence[EnergyRow]) -> Check:
    """The check for one row, given every row of its phase."""
    view = run.source(row.source)
    if row.method == "counter":
        if row.energy_j is None or not math.isfinite(row.energy_j):
            return failed("the counter gave no figure for the window")
        if abs(row.energy_j) > ZERO_J:
            return MOVED
        me = device_identity(view)
        drawing = [r for r in phase_rows if r.method == "power" and r.mean_power_w
                   and r.mean_power_w > 0 and me
                   and device_identity(run.source(r.source)) == me]
        if drawing:
            r = drawing[0]
            return failed(f"the counter moved 0 J while {r.source}:{r.channel} averaged "
                          f"{r.mean_power_w:.1f} W")
        return passed("the counter moved 0 J and no power stream of its device drew power")
    source = str(view.descriptor.get("config", {}).get("energy_source") or "")
    if source.startswith("integrated:"):
        return passed(f"no energy counter on this GPU ({source.partition(', because ')[2]}): "
                      f"its energy is {source.split()[1].rstrip(',')}, integrated")
    return NOT_A_COUNTER
