"""Mean power of a stream over windows, as measured or corrected by a calibration record.

One pass over the stream per call (``integrate_view`` at every window edge); gaps are
never bridged: a window's mean is over its covered time, NaN where too little is covered.
A corrected mean is ((∫target over the window shifted by the record's energy delay) / T −
offset) / gain, as ``energy --calibration`` corrects.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import integrate_view, known_gaps_ns, span_s
from wattlab.analysis.energy.source_energy import correction_terms
from wattlab.runfile import CalibrationRecord, Run, SourceView

FloatArray = npt.NDArray[np.float64]
MAX_UNCOVERED = 0.1
"""A window more than this share uncovered has no mean; less: the mean of what was covered
(a riser streaming 20 kHz over USB loses a few frames a second on a busy host). The
validity verdict of each scored window says how much was covered."""


def window_means(run: Run, view: SourceView, channel: str, windows_s: FloatArray,
                 record: CalibrationRecord | None = None) -> FloatArray:
    """Mean power over each (start, end) row of ``windows_s``; NaN where mostly uncovered."""
    windows = np.asarray(windows_s, dtype=np.float64).reshape(-1, 2)
    gain = offset_w = 0.0
    if record is not None:
        (gain, _), (offset_w, _), (delay_s, _) = correction_terms(record)
        windows = windows + delay_s
    first, last = span_s(view)
    q = np.unique(windows.ravel())
    cum = integrate_view(view, [channel], np.clip(q, first, last),
                         known_gaps_ns=known_gaps_ns(run, view.source_id), bridges=False)[0]
    a, b = windows[:, 0], windows[:, 1]
    ia, ib = np.searchsorted(q, a), np.searchsorted(q, b)
    energy_j = cum.integral[ib] - cum.integral[ia]
    uncovered_s = cum.uncovered_s[ib] - cum.uncovered_s[ia]
    covered_s = (b - a) - uncovered_s
    inside = (a >= first) & (b <= last) & (uncovered_s <= MAX_UNCOVERED * (b - a))
    means = np.where(inside, energy_j / np.where(inside, covered_s, 1.0), np.nan)
    return means if record is None else (means - offset_w) / gain
