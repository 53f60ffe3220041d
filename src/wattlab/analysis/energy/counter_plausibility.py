"""Does a GPU's energy counter agree with its own power readings? Said where it does not.

Why: AMD's energy accumulator is known to misbehave (a wrong ``counter_resolution`` on some
firmware, 32-bit wraps, resets), and a counter that is wrong by a constant factor looks
perfectly smooth. The GPU's socket power, integrated over the same span, is an independent
view of the same joules, so a reader whose descriptor asks for the check
(``config["energy_counter"]["plausible_pct"]``) gets it: the two must agree within that
share plus both estimates' stated ±.
"""

from __future__ import annotations

import math
from typing import Any

from wattlab.runfile import Run, SourceView

POWER_CHANNELS = ("average_power_w", "instant_power_w")  # the steadier view first


def _power_row(run: Run, energy_view: SourceView,
               rows: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any] | None:
    """The energy row of the same GPU's power stream (the stream beside the counter's)."""
    stem = energy_view.source_id.rsplit(".", 1)[0]
    view = run.sources.get(f"{stem}.power")
    if view is None:
        return None
    return next((rows[(view.source_id, ch)] for ch in POWER_CHANNELS
                 if (view.source_id, ch) in rows and rows[(view.source_id, ch)]["energy_j"]),
                None)


def counter_checks(run: Run, rows: dict[tuple[str, str], dict[str, Any]]
                   ) -> dict[str, dict[str, Any]]:
    """Per counter stream that asks for it: both energies, the difference and the verdict."""
    out: dict[str, dict[str, Any]] = {}
    for view in run.sources.values():
        counter = view.descriptor.get("config", {}).get("energy_counter") or {}
        pct = counter.get("plausible_pct")
        energy = rows.get((view.source_id, "energy_j"))
        if pct is None or energy is None or energy["energy_j"] is None:
            continue
        power = _power_row(run, view, rows)
        if power is None:
            continue
        e_c, e_p = float(energy["energy_j"]), float(power["energy_j"])
        slack_j = float(pct) / 100 * abs(e_p) + math.hypot(energy["uncertainty_j"] or 0.0,
                                                           power["uncertainty_j"] or 0.0)
        out[view.source_id] = {
            "counter_j": e_c, "power_j": e_p, "power_stream":
                f"{power['source']}:{power['channel']}",
            "difference_pct": 100 * (e_c - e_p) / e_p if e_p else None,
            "tolerance_j": slack_j, "plausible": abs(e_c - e_p) <= slack_j}
    return out


def describe(source: str, check: dict[str, Any]) -> str:
    """One line for a report: what disagrees, by how much, and what to trust."""
    return (f"{source}: the energy counter says {check['counter_j']:.1f} J, the integrated "
            f"{check['power_stream']} {check['power_j']:.1f} J "
            f"({check['difference_pct']:+.1f} %, beyond the ±{check['tolerance_j']:.1f} J "
            "allowed): the counter is implausible (wrong counter_resolution, a reset or a "
            "missed wrap); trust the power stream, or check the firmware")
