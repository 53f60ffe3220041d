"""What a fitted delay below zero means, said beside it.

Why: the kernels are causal (a reading only ever follows the power it reports), so a
negative delay is not a filter running ahead of the power. It says that the target's
readings are stamped earlier than the reference's for the same power: an offset between
the two streams' timestamps (when each reading is stamped, a meter's own lag, clocks not
aligned). The correction shifts by it all the same; printed bare under "causal kernels"
it reads as a contradiction.
"""

from __future__ import annotations

SIGNIFICANT_SE = 2.0
"""A delay further below 0 than this many standard errors is a lead, not noise."""


def lead_note(delay_s: float | None, se_s: float | None) -> str | None:
    """One line on a negative delay (None for a zero, positive or unknown one)."""
    if delay_s is None or delay_s >= 0:
        return None
    if se_s is not None and -delay_s <= SIGNIFICANT_SE * se_s:
        return (f"below 0 by less than {SIGNIFICANT_SE:g} standard errors: "
                "indistinguishable from 0 (no delay between the streams)")
    return (f"negative: the target's readings lead the reference's by {-delay_s * 1e3:.3g} "
            "ms for the same power, an offset between the two streams' timestamps, not a "
            "causal filter; the correction shifts by it all the same")
