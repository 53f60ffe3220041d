"""Mean power of a stream over windows, as measured or corrected by a calibration record.

An energy counter (a J channel, the GPU's own, where no meter is wired) gives its mean power
over a window as its difference over the window's length.

One pass over the stream per call (``integrate_view`` at every window edge), holes bridged
as ``energy`` bridges them.
A corrected mean is ((∫target over the window shifted by the record's energy delay) / T −
offset) / gain, as ``energy --calibration`` corrects.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import integrate_view, known_gaps_ns, span_s
from wattlab.analysis.energy import Phase, correction_terms, counter_energy, shape_source
from wattlab.runfile import CalibrationRecord, Run, SourceView

FloatArray = npt.NDArray[np.float64]
MAX_UNBRIDGED = 0.5
"""A window with more than this share that no line between edge samples bridges (outside
the data, next to a non-finite value) has no mean."""


def window_means(run: Run, view: SourceView, channel: str, windows_s: FloatArray,
                 record: CalibrationRecord | None = None) -> FloatArray:
    """Mean power over each (start, end) row of ``windows_s``; NaN where mostly unbridged.

    A hole is bridged by a line between its edge samples, as ``energy``'s best estimate
    does: a riser streaming 20 kHz over USB loses frames on a busy host, and a held level
    is what a line bridges well. Each scored window's validity verdict (coverage) still
    says how much was measured.
    """
    windows = np.asarray(windows_s, dtype=np.float64).reshape(-1, 2)
    if view.unit(channel) == "J":
        return _counter_means(run, view, channel, windows)
    gain = offset_w = 0.0
    if record is not None:
        (gain, _), (offset_w, _), (delay_s, _) = correction_terms(record)
        windows = windows + delay_s
    first, last = span_s(view)
    q = np.unique(windows.ravel())
    cum = integrate_view(view, [channel], np.clip(q, first, last),
                         known_gaps_ns=known_gaps_ns(run, view.source_id))[0]
    a, b = windows[:, 0], windows[:, 1]
    ia, ib = np.searchsorted(q, a), np.searchsorted(q, b)
    energy_j = cum.integral[ib] - cum.integral[ia] + cum.bridge[ib] - cum.bridge[ia]
    unbridged_s = cum.unbridged_s[ib] - cum.unbridged_s[ia]
    counted_s = (b - a) - unbridged_s
    inside = (a >= first) & (b <= last) & (unbridged_s <= MAX_UNBRIDGED * (b - a))
    means = np.where(inside, energy_j / np.where(inside, counted_s, 1.0), np.nan)
    return means if record is None else (means - offset_w) / gain


def _counter_means(run: Run, view: SourceView, channel: str, windows: FloatArray
                   ) -> FloatArray:
    """Mean power over each window from an energy counter, differenced as ``energy`` does.

    Why: on a machine with no meter the GPU's own counter is the one stream that sums all
    the energy (it kept counting between reads); its edges are placed as ``energy`` places
    them (``counter_energy``). A window mostly outside the counter's reads has no mean.
    """
    phases = [Phase(str(k), 0, float(a), float(b), "") for k, (a, b) in enumerate(windows)]
    rows = counter_energy(view, channel, phases, shape_source(run, view))
    return np.array([r.mean_power_w if r.mean_power_w is not None and r.uncovered_s
                     <= MAX_UNBRIDGED * (r.t1_s - r.t0_s) else np.nan for r in rows],
                    dtype=np.float64)
