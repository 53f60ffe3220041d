"""A driver's update period when it is polled at a similar rate (90 ms polls, 100 ms updates).

Why: a reading is first seen at the poll after the driver updated it, so first-seen times
lie on the *poll* grid: with polls every 90 ms and updates every 100 ms they are 90 or
180 ms apart, and a period read off their spacing is the poll's (on a real H100 at the
default cadence, ``calibrate`` reported 90 ms). What tells the two apart is which polls saw
nothing new: with updates a little slower than polls, one poll in every B sees no update
(B = P / (P - poll), the beat in polls: 10 for 100 ms updates under 90 ms polls), so those
repeats lie on a lattice of poll indices. Updates that repeat the previous value add
repeats off that lattice; none can remove one from it.

The fit: for each candidate beat B (and phase), lattice points with a repeat within half a
poll count for it, lattice points without one against it; sub-multiples of the true beat
leave most of their points empty and multiples explain fewer repeats, so the true beat
wins. P = poll · B / (B − 1). Update instants follow: the lattice's repeats mark where an
update fell just after a poll.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
MIN_BEATS = 8
"""Fewest lattice points (beats) a fit must rest on."""
MAX_CHANCE = 1e-4
"""Largest probability that randomly placed repeats would hit as many lattice points."""
MIN_HIT_FRACTION = 0.6
"""Lattice points that must hold a repeat (some are lost to poll jitter at the wrap; half
the lattice of a wrong sub-multiple beat is empty by construction)."""
BEAT_STEP = 2e-3
"""Relative step of the first search over the beat (then refined around the best)."""
COARSE_POLLS = 1500
"""Polls the first search looks at; the refinement uses every poll."""


@dataclass(frozen=True)
class PollLattice:
    """Update instants behind a polled stream's readings, and how sure the period is."""

    period_s: float
    period_se_s: float
    update_t_s: FloatArray  # each new reading's update instant
    hit_fraction: float  # lattice points that held a repeat


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), summed in logs (no scipy: it costs ~0.9 s to import)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
             + i * log_p + (n - i) * log_q for i in range(k, n + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def _lattice_scores(j: FloatArray, n_polls: int, beat: float,
                    phase_step: float = 0.25) -> tuple[float, float, float]:
    """(score, phase, hit fraction) of the best phase for one beat (all phases at once)."""
    phases = np.arange(0.0, beat, phase_step)[:, None]
    m = np.round((j[None, :] - phases) / beat)
    hit = np.abs(j[None, :] - phases - m * beat) <= 0.5
    # two repeats within a poll of one lattice point count once
    double = hit[:, 1:] & hit[:, :-1] & (m[:, 1:] == m[:, :-1])
    hits = hit.sum(axis=1) - double.sum(axis=1)
    points = (n_polls - 1 - phases[:, 0]) // beat + 1
    scores = 2 * hits - points
    k = int(np.argmax(scores))
    return float(scores[k]), float(phases[k, 0]), float(hits[k] / max(points[k], 1))


def _search_beat(j: FloatArray, n_polls: int) -> tuple[float, float]:
    """The best beat in polls, and the span of beats tied with it (coarse, then on all)."""
    first = j[j < COARSE_POLLS]
    n_first = min(n_polls, COARSE_POLLS)
    beats = np.exp(np.arange(math.log(2.0), math.log(n_first / MIN_BEATS), BEAT_STEP))
    scores = [_lattice_scores(first, n_first, b, 0.5)[0] for b in beats]
    beat, step = float(beats[int(np.argmax(scores))]), BEAT_STEP
    while True:  # refine on every poll until the last lattice point moves < 0.1 poll
        grid = beat * np.exp(np.arange(-5, 6) * step)
        fine = np.array([_lattice_scores(j, n_polls, b)[0] for b in grid])
        tied = grid[fine >= fine.max()]
        beat = float(np.mean(tied))
        if step * n_polls < 0.1:
            return beat, float(tied[-1] - tied[0])
        step /= 4
def fit_poll_lattice(poll_t_s: FloatArray, values: FloatArray) -> PollLattice | None:
    """The update lattice behind every poll's time and value, or None where none is seen.

    ``poll_t_s``: every poll (every row of the stream, repeats included), ``values`` their
    readings. None when every poll saw a new value (the period is not observable), when
    most polls repeat (updates slower than two polls: ``update_lattice``'s case), or when
    the repeats fall on no lattice.
    """
    ok = np.isfinite(values)
    s, v = poll_t_s[ok], values[ok]
    if s.size < 40:
        return None
    new = np.concatenate(([True], v[1:] != v[:-1]))
    repeats = np.flatnonzero(~new).astype(np.float64)
    if repeats.size < MIN_BEATS or repeats.size > 0.5 * s.size:
        return None
    poll = float(np.median(np.diff(s)))
    beat, tied_span = _search_beat(repeats, s.size)
    _, phase, hit_fraction = _lattice_scores(repeats, s.size, beat)
    points = int((s.size - 1 - phase) // beat + 1)
    # repeats that fall on a lattice by chance (random repeated values) must not make one
    chance = binomial_tail(round(hit_fraction * points), points, repeats.size / s.size)
    if hit_fraction < MIN_HIT_FRACTION or points < MIN_BEATS or chance > MAX_CHANCE:
        return None
    period = poll * beat / (beat - 1.0)
    # the beat is known to within the tied span and to half a poll over the whole record
    beat_se = max(tied_span / math.sqrt(12), 0.5 * beat**2 / s.size)
    period_se = poll * beat_se / (beat - 1.0) ** 2
    # a tick fell within (P − poll) after each lattice repeat's poll (the ticks gain that much
    # on the polls at every step): the lattice's phase in time, to ± (P − poll) / 2
    m = np.round((repeats - phase) / beat)
    on = np.abs(repeats - phase - m * beat) <= 0.5
    marks = s[repeats[on].astype(np.int64)]
    angle = 2 * np.pi * (marks - marks[0]) / period
    origin = (float(marks[0]) + 0.5 * (period - poll)
              + period * float(np.angle(np.exp(1j * angle).mean())) / (2 * np.pi))
    # each reading's update is the tick in the poll interval before it: the tick nearest
    # the interval's middle (the only one within it, polls being shorter than the period)
    first_seen = s[new]
    update_t = origin + np.round((first_seen - 0.5 * poll - origin) / period) * period
    return PollLattice(period, period_se, update_t, hit_fraction)
