"""Fit how the driver's power reading relates to a reference: lag, smoothing, gain, offset.

Model: ``target(u) = g · (h * reference)(u − τ) + c`` where ``u`` is when the target's value
was last updated (NVML readings are held between ~100 ms updates; each distinct reading is
one observation, evaluated at the instant it appeared). Convention: kernels are *causal*
and start at 0 — a boxcar of width w averages the trailing window [u − τ − w, u − τ], a
first-order lag has time constant T — so τ is the pure delay and the *effective* delay is
τ + the kernel's centroid (w/2 or T). A "part-time" kernel is a boxcar narrower than the
update period: the driver only observes w/P of the time (its *coverage*).

Reference integrals come from a cumulative sum on a fine grid, so τ and w are continuous
parameters (no grid quantisation); g and c are solved by least squares for each (τ, w).
Uncertainties are batch means: the fit is repeated on ``blocks`` consecutive stretches
(for g and c weighted by each block's information, ``batch_means``).
A long recording (more than ``kernel_fit.SEARCH_POINTS`` readings) is searched on a subset
and a coarser grid first, then refined on everything (``kernel_fit.fit_kernels``).

Here: the target's update instants, the steps of a calibration, and its record in a run
file or a JSON file. The steps' pieces are beside it: the reference on its grid
(reference_grid.py), the kernels and their fit (kernel_fit.py), the fit's uncertainties
and identifiability (fit_uncertainty.py), the energy shift and errors (energy_check.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import (
    GAP_FACTOR,
    LagEstimate,
    estimate_lag,
    grid_edges,
    resample_points,
    resolve,
    span_s,
)
from wattlab.analysis.calibration.energy_check import TargetEnergy, energy_errors
from wattlab.analysis.calibration.figure_validity import calibration_validity
from wattlab.analysis.calibration.fit_uncertainty import (
    batch_errors,
    identify,
    power_dependent_gain,
)
from wattlab.analysis.calibration.identifiability import KernelFit, Verdict
from wattlab.analysis.calibration.kernel_fit import (
    MAX_KERNEL_S,
    MODELS,
    WIDTH_NAME,
    ChosenKernel,
    choose_kernel,
)
from wattlab.analysis.calibration.poll_lattice import fit_poll_lattice
from wattlab.analysis.calibration.reference_grid import coarser_means, reference_grid
from wattlab.analysis.energy import stream_identity
from wattlab.errors import RunFileError, UsageError
from wattlab.runfile import (
    RECORD_FORMAT,
    CalibrationRecord,
    CalibrationValidity,
    CrossCorrelation,
    EnergyCheck,
    Estimate,
    FitSummary,
    FittedParams,
    GainTest,
    Identifiability,
    KernelCandidate,
    Profiles,
    ReferenceStream,
    Run,
    SourceView,
    StreamKey,
    TargetStream,
    finite,
    write_calibration,
)

FloatArray = npt.NDArray[np.float64]
KERNELS = ("boxcar", "first_order")
MIN_OVERLAP_FACTOR = 3.0
"""Reference and target must overlap this many (max lag + longest kernel) spans."""
CONVENTION = ("causal kernels starting at 0 (a boxcar averages the trailing window "
              "[u-tau-w, u-tau]); tau is the pure delay; effective delay = tau + centroid")


class TargetUpdates(NamedTuple):
    """The distinct readings of a polled stream and how it was polled."""

    t_s: FloatArray  # when each value first appeared
    values: FloatArray
    held: bool  # values were held between polls: the instrument updates less often
    poll_s: float  # median time between polls


def target_updates(view: SourceView, channel: str) -> TargetUpdates:
    """Distinct readings: each value at the time it first appeared, and the poll rhythm.

    ``held``: more than 5 % of the polls repeated the value before; a meter that gives a new
    value at every read repeats one only by chance (a 90 ms poll of a 100 ms update repeats
    ~10 %, a 20 ms poll ~80 %).
    """
    t = view.time_ns.astype(np.float64) / 1e9
    v = view.channel(channel).astype(np.float64)
    ok = np.isfinite(v)
    t, v = t[ok], v[ok]
    if t.size < 20:
        raise RunFileError(f"source {view.source_id!r}: too few readings to calibrate")
    new = np.concatenate(([True], v[1:] != v[:-1]))
    held = float(1 - new.mean()) > 0.05
    return TargetUpdates(t[new], v[new], held, float(np.median(np.diff(t))))


def _lower_envelope(n: FloatArray, y: FloatArray) -> tuple[float, float]:
    """(u0, P) of the line under every point (n, y) with the least total gap above it.

    Poll delays only ever add, so the updates lie on the lower envelope: the line is the
    edge of the lower convex hull above the mean of n (an LP's solution; stalled polls far
    above it do not move it, unlike a least-squares line).
    """
    hull: list[int] = []
    for i in range(n.size):  # monotone chain; n is increasing
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (y[b] - y[a]) * (n[i] - n[a]) >= (y[i] - y[a]) * (n[b] - n[a]):
                hull.pop()  # b is on or above the chord a-i
            else:
                break
        hull.append(i)
    if len(hull) < 2:
        return float(y[0]), 0.0
    mean_n = float(n.mean())
    k = int(np.searchsorted(n[hull], mean_n).clip(1, len(hull) - 1))
    a, b = hull[k - 1], hull[k]
    slope = float((y[b] - y[a]) / (n[b] - n[a]))
    return float(y[a] - slope * n[a]), slope


def update_lattice(x: FloatArray, poll_s: float = 0.0) -> tuple[FloatArray, float, float] | None:
    """The driver's periodic update instants behind the times readings were first seen.

    A reading is first seen at the poll after the driver's update, so first-seen times lag
    the updates by 0..1 poll interval (``poll_s``); if the updates are periodic (readings
    fall on a lattice n·P + u0 with at most one reading per tick), the lattice's lower
    envelope gives the update instants (a reading after a stalled poll keeps its own time,
    or the next update's if that is earlier). Returns (update times, period s, mean poll
    delay s) or None when the readings are not periodic.

    The ticks between two readings are counted step by step from the period, less what the
    poll delay can add: polled well inside the period, two readings 1.8 periods apart are
    two ticks apart; polled at 0.9 of it, they are one tick apart with delays 0.05 and 0.85.
    """
    if x.size < 20:
        return None
    step = np.diff(x)
    # the period: a tick per reading (each update seen once), or the usual step (fast polls;
    # a missed update makes the first too long, slow polls make the second too short)
    p0 = max(float((x[-1] - x[0]) / (x.size - 1)), float(np.median(step)))
    slack = max(0.0, poll_s - 0.5 * p0)  # how much of a step the poll delay may be
    n = np.concatenate(([0.0], np.cumsum(np.maximum(1.0, np.round((step - slack) / p0)))))
    # the first reading shows the value held when recording began, not an update
    u0, period = _lower_envelope(n[1:], x[1:] - x[0])
    u0 += float(x[0])
    delay = x - u0 - n * period
    snap = delay <= max(0.8, 1.05 * poll_s / period) * period  # else a stalled poll
    snap[0] = False
    snap[1:] &= np.diff(n) >= 1
    if snap.mean() < 0.9:
        return None
    u = np.minimum.accumulate(np.where(snap, x - delay, x)[::-1])[::-1]
    return u, period, float(delay[snap].mean())


def _held_lattice(view: SourceView, channel: str, first_seen_s: FloatArray, poll_s: float
                  ) -> tuple[FloatArray, float, float, float] | None:
    """(update instants, period, its standard error, mean poll delay) of held readings.

    Polls well inside the update period: the readings' own lattice (``update_lattice``).
    Polls at a similar rate (the default 90 ms against 100 ms updates): the pattern of
    polls that saw nothing new (``fit_poll_lattice``).
    """
    polled = fit_poll_lattice(view.time_ns.astype(np.float64) / 1e9,
                              view.channel(channel).astype(np.float64))
    if polled is not None and polled.update_t_s.size == first_seen_s.size:
        delay = float(np.mean(first_seen_s - polled.update_t_s))
        return polled.update_t_s, polled.period_s, polled.period_se_s, delay
    lattice = update_lattice(first_seen_s, poll_s)
    if lattice is None:
        return None
    updates, period, delay = lattice
    return updates, period, period / math.sqrt(12 * first_seen_s.size), delay


def update_instants(view: SourceView, channel: str) -> tuple[FloatArray, FloatArray, float] | None:
    """(update instants s, readings, period s) of a held stream, or None off a lattice.

    Why: a reading is an exact window integral only at the instant the driver computed it;
    first-seen times add up to a poll of jitter, which a deconvolution cannot tell from power.
    """
    first_seen, values, held, poll_s = target_updates(view, channel)
    lattice = _held_lattice(view, channel, first_seen, poll_s) if held else None
    if lattice is None:
        return None
    return lattice[0], values, lattice[1]


@dataclass(frozen=True)
class _Observed:
    """The target's distinct readings, when each was observed, and how often it updates.

    ``t_s``: the driver's update instants where they lie on a lattice (``lattice``), else
    when each reading was first seen; ``poll_delay_s`` and ``period_se_s`` are NaN off a
    lattice.
    """

    t_s: FloatArray
    values: FloatArray
    held: bool
    period_s: float
    period_se_s: float
    poll_delay_s: float
    lattice: bool


def _observe(view: SourceView, channel: str, target: str, update_times: str) -> _Observed:
    """The target's readings at their update instants (``update_times``: see ``calibrate``)."""
    if update_times not in ("auto", "lattice", "first_seen"):
        raise UsageError(f"update_times {update_times!r}: use auto, lattice or first_seen")
    x_all, y_all, held, poll_s = target_updates(view, channel)
    period = float(np.median(np.diff(x_all)))
    lattice = (_held_lattice(view, channel, x_all, poll_s)
               if held and update_times != "first_seen" else None)
    if lattice is None and update_times == "lattice":
        raise UsageError(f"{target}: readings are not on a periodic update lattice")
    if lattice is None:
        return _Observed(x_all, y_all, held, period, math.nan, math.nan, False)
    x_all, period, period_se, poll_delay = lattice
    return _Observed(x_all, y_all, held, period, period_se, poll_delay, True)


def calibrate(
    run: Run,
    reference: str,
    target: str,
    *,
    grid_rate_hz: float = 1000.0,
    blocks: int = 8,
    max_lag_s: float = 2.0,
    kernels: tuple[str, ...] = KERNELS,
    min_phase_s: float = 2.0,
    update_times: str = "auto",
) -> CalibrationRecord:
    """Fit ``target`` (e.g. ``gpu0.power:average_power_w``) against ``reference``.

    Returns the calibration record (``CalibrationRecord``): kernel, τ, width, gain, offset with
    standard errors, fit residual, update period and coverage, power-dependent gain test,
    and energy error before/after correction overall and per phase. ``update_times``:
    held readings are observed at their driver update instants when these are periodic
    (``auto``; see ``update_lattice``), or always (``lattice``) / never (``first_seen``).
    """
    for kern in kernels:
        if kern not in MODELS:
            raise UsageError(f"unknown kernel {kern!r}; kernels are {sorted(MODELS)}")
    ref_view, ref_ch = resolve(run, reference)
    tgt_view, tgt_ch = resolve(run, target)
    r0, r1 = span_s(ref_view)
    seen = _observe(tgt_view, tgt_ch, target, update_times)
    x_all, y_all = seen.t_s, seen.values
    t0 = max(r0, float(x_all[0]) - max_lag_s - MAX_KERNEL_S)
    t1 = min(r1, float(x_all[-1]) + max_lag_s)
    if t1 - t0 < MIN_OVERLAP_FACTOR * (max_lag_s + MAX_KERNEL_S):
        raise UsageError(f"{run.path}: {reference} and {target} overlap for only "
                         f"{max(t1 - t0, 0):.1f} s; calibration needs "
                         f"{MIN_OVERLAP_FACTOR * (max_lag_s + MAX_KERNEL_S):.0f} s")
    ref, ref_cum = reference_grid(run, ref_view, ref_ch, (t0, t1), grid_rate_hz)
    core = (x_all >= t0 + max_lag_s + MAX_KERNEL_S) & (x_all <= t1 - max_lag_s)
    x, y = x_all[core], y_all[core]
    # first guess of the effective delay by cross-correlation on a 100 Hz grid
    coarse = min(100.0, grid_rate_hz)
    c_edges = grid_edges(t0, t1, coarse)
    c_ref = coarser_means(ref_cum, c_edges)
    del ref_cum
    c_tgt = resample_points(x_all, y_all, 0.5 * (c_edges[1:] + c_edges[:-1]),
                            GAP_FACTOR * max(seen.period_s, 1e-3))
    lag = estimate_lag(c_ref, c_tgt, coarse, max_lag_s=max_lag_s)
    fit = choose_kernel(kernels, ref, x, y, lag.lag_s)
    tau, width, centroid = fit.tau_s, fit.width_s, fit.centroid_s

    # energy-window shift d: the target's energy over [a+d, b+d] matches the reference's;
    # the target must cover every shifted window [a + d, b + d] (d within ±0.3 s of d0)
    tgt = TargetEnergy(run, tgt_view, tgt_ch, readings_t_s=x_all, readings=y_all, ref=ref)
    tgt_end = float(x_all[-1]) - tau - centroid - 0.35
    d_energy = tgt.delay_fit(float(x[0]), min(float(x[-1]), tgt_end), fit.gain, fit.offset_w,
                             tau + centroid)
    if not math.isfinite(d_energy):
        d_energy = tau + centroid

    batch = batch_errors(ref, x, y, fit, target=tgt, blocks=blocks, d_energy=d_energy,
                         target_end_s=tgt_end, period_s=seen.period_s)
    se = dict(batch.se)
    verdict, profiles = identify(
        ref, x, y, KernelFit(tau, width, centroid / width), kernel=fit.kernel, resid=fit.resid,
        r2=fit.r2, gain=(fit.gain, se["g"]), period_s=seen.period_s,
        ref_means=(c_ref, 1.0 / coarse))
    # where the data cannot pin a parameter, its uncertainty says so (batch means cannot)
    se["w"] = float(np.nanmax([se["w"], verdict.se_floor["w"]]))
    se["eff"] = float(np.nanmax([se["eff"], verdict.se_floor["eff"]]))
    se["tau"] = float(np.nanmax([se["tau"], math.hypot(verdict.se_floor["eff"],
                                                       centroid / width * se["w"])]))
    energy = energy_errors(run, ref, tgt, g=(fit.gain, se["g"]), c=(fit.offset_w, se["c"]),
                           d=(d_energy, se["d"]), min_phase_s=min_phase_s)
    validity = calibration_validity(run, (ref_view, ref_ch), (tgt_view, tgt_ch),
                                    fit_ref_s=(t0, t1), fit_target_s=(float(x[0]), float(x[-1])),
                                    energy=energy, delay_s=d_energy)
    return _record(
        run, (ref_view, ref_ch), (tgt_view, tgt_ch), fit=fit, se=se, seen=seen,
        d_energy=d_energy, lag=lag, verdict=verdict, profiles=profiles,
        fit_summary=FitSummary(finite(math.sqrt(fit.mse)), finite(fit.r2), int(fit.n),
                               grid_rate_hz, int(batch.fitted)),
        gain_test=power_dependent_gain(fit, x, y, batch), energy=energy, validity=validity)


def _record(run: Run, ref: tuple[SourceView, str], tgt: tuple[SourceView, str], *,
            fit: ChosenKernel, se: dict[str, float], seen: _Observed, d_energy: float,
            lag: LagEstimate, verdict: Verdict, profiles: Profiles, fit_summary: FitSummary,
            gain_test: GainTest, energy: EnergyCheck, validity: CalibrationValidity
            ) -> CalibrationRecord:
    """The calibration record: what was fitted against what, and how well it holds."""
    (ref_view, ref_ch), (tgt_view, tgt_ch) = ref, tgt
    kernel, tau, width, period = fit.kernel, fit.tau_s, fit.width_s, seen.period_s
    held_coverage = min(1.0, width / period) if kernel == "boxcar" else 1.0
    name = "part_time" if kernel == "boxcar" and width < 0.9 * period else kernel
    return CalibrationRecord(
        format=RECORD_FORMAT, key=StreamKey(**stream_identity(tgt_view, tgt_ch)),
        target=TargetStream(tgt_view.source_id, tgt_ch, tgt_view.unit(tgt_ch)),
        reference=ReferenceStream(ref_view.source_id, ref_ch, ref_view.model, ref_view.kind),
        run=run.path, created=datetime.now(UTC).isoformat(), convention=CONVENTION,
        kernel=name,
        params=FittedParams(Estimate.of(tau, se["tau"]), WIDTH_NAME[kernel],
                            Estimate.of(width, se["w"]), Estimate.of(fit.gain, se["g"]),
                            Estimate.of(fit.offset_w, se["c"])),
        effective_delay_s=Estimate.of(tau + fit.centroid_s, se["eff"]),
        energy_delay_s=Estimate.of(d_energy, se["d"]),
        cross_correlation_lag=CrossCorrelation(finite(lag.lag_s), finite(lag.correlation),
                                               finite(lag.confidence),
                                               finite(lag.uncertainty_s)),
        verdict=Identifiability(bool(verdict.identifiable), tuple(verdict.warnings),
                                verdict.advice),
        profiles=profiles, update_period_s=float(period),
        update_period_se_s=finite(seen.period_se_s), held_readings=bool(seen.held),
        update_times="lattice" if seen.lattice else "first_seen",
        poll_delay_s=finite(seen.poll_delay_s), coverage=float(held_coverage), fit=fit_summary,
        kernels={k: KernelCandidate(finite(math.sqrt(v[2])), finite(v[0]), WIDTH_NAME[k],
                                    finite(v[1])) for k, v in fit.fits.items()},
        power_dependent_gain=gain_test, energy=energy, validity=validity)


# --------------------------------------------------------------------------- records


def store_in_run(path: str, record: CalibrationRecord) -> str:
    """Write the record under /analysis/calibration/<source>:<channel> (raw data untouched).

    Needs the recorder to have closed the file; a record of the same stream is replaced.
    """
    return write_calibration(path, record, hint=" (or use --no-store)")


def load_record(path: str, *, force: bool = False) -> CalibrationRecord:
    """A calibration record from JSON (checked for the fields energy correction needs).

    A record whose data could not pin the kernel is refused unless ``force``: applying it
    would correct energy with numbers the recording could not tell.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not text (an HDF5 file)
        raise UsageError(f"{path}: not a readable calibration JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
        raise UsageError(f"{path}: not a wattlab calibration record ({RECORD_FORMAT})")
    try:
        record = CalibrationRecord.from_json(doc)
    except RunFileError as e:
        raise UsageError(f"{path}: calibration record {e}") from e
    for name, value in (("params.gain", record.params.gain.value),
                        ("params.offset_w", record.params.offset_w.value),
                        ("energy_delay_s", record.energy_delay_s.value)):
        if value is None:
            raise UsageError(f"{path}: calibration record lacks {name}")
    verdict = record.verdict
    if not verdict.identifiable and not force:
        reasons = "; ".join(verdict.warnings) or "no reason recorded"
        raise UsageError(f"{path}: this calibration is not identifiable ({reasons}); "
                         f"{verdict.advice or 'record a richer load'}, or pass "
                         "--force-calibration to apply it anyway")
    return record
