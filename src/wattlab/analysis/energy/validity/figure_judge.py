"""Every check on every figure of an energy report: each row gets ``valid`` and ``checks``.

Why one place: `energy`, the report, `export` and the metrics all carry the same verdict,
so it is made once, on the rows ``energy_report`` builds; a total (a group of phases
summed) is valid only if every figure it sums is, and names those that are not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from wattlab.analysis.energy.validity.counter_check import counter_checks
from wattlab.analysis.energy.validity.silent_zero import no_silent_zero
from wattlab.analysis.energy.validity.stream_checks import coverage, identities, time_order
from wattlab.analysis.energy.validity.time_scan import scan_times
from wattlab.analysis.energy.validity.verdict import Check, checks_json, failed, not_applicable
from wattlab.analysis.energy.validity.window_check import window_check
from wattlab.runfile import Run

if TYPE_CHECKING:
    from wattlab.analysis.energy.source_energy import EnergyRow

UNPAIRED = not_applicable("not an energy counter, nor the 50 Hz samples one is compared with")
NO_FIGURE = failed("no figure: nothing in the window to integrate")


def judge(run: Run, rows: Sequence[EnergyRow], run_s: tuple[float, float],
          asked: Mapping[str, tuple[float, float]]) -> None:
    """Set ``valid`` and ``checks`` on each row (``asked``: requested windows by label)."""
    ident = identities(list(run.sources.values()))  # every stream names its device's identity
    by_phase: dict[str, list[EnergyRow]] = {}
    for r in rows:
        by_phase.setdefault(r.phase, []).append(r)
    cross = _cross_checks(run, rows)
    for r in rows:
        scan = scan_times(run.source(r.source))
        checks: dict[str, Check] = {
            "coverage": coverage(scan, r.t0_s, r.t1_s, r.method, r.uncovered_s),
            "time": time_order(scan, r.t0_s, r.t1_s, r.energy_j is not None),
            "identity": ident[r.source],
            "counter_vs_integral": cross.get((r.source, r.channel, r.phase), UNPAIRED),
            "no_silent_zero": no_silent_zero(run, r, by_phase[r.phase]),
            "window": window_check(asked.get(r.phase), (r.t0_s, r.t1_s), run_s),
        }
        if r.energy_j is None and all(c.ok for c in checks.values()):
            checks["coverage"] = NO_FIGURE
        r.checks = checks_json(checks)
        r.valid = all(c.ok for c in checks.values())
    _totals(rows)


def _cross_checks(run: Run, rows: Sequence[EnergyRow]
                  ) -> dict[tuple[str, str, str], Check]:
    """The counter check of each counter row, and the same on its samples' rows."""
    out: dict[tuple[str, str, str], Check] = {}
    counters = dict.fromkeys((r.source, r.channel) for r in rows if r.method == "counter")
    for source, channel in counters:
        windows = {r.phase: (r.t0_s, r.t1_s) for r in rows
                   if (r.source, r.channel) == (source, channel)}
        checks, samples = counter_checks(run, run.source(source), channel, windows)
        for phase, check in checks.items():
            out[(source, channel, phase)] = check
            if samples:
                s_source, _, s_channel = samples.rpartition(":")
                out[(s_source, s_channel, phase)] = check
    return out


def _totals(rows: Sequence[EnergyRow]) -> None:
    """A row that sums others (``parts``) is invalid where one of them is, and says which."""
    valid = {(r.source, r.channel, r.phase): r.valid for r in rows if not r.parts}
    for r in rows:
        if not r.parts:
            continue
        bad = [p for p in r.parts if not valid.get((r.source, r.channel, p), False)]
        r.invalid_parts = bad
        if bad:
            r.valid = False
