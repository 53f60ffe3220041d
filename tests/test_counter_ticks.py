"""Counter reads placed at the updates they show, where the reads pin the update grid."""

from __future__ import annotations

import numpy as np
import pytest

import wattlab
from wattlab.analysis.energy.counter_ticks import at_updates, update_phase_s
from wattlab.analysis.energy.source_energy import energy_report
from wattlab.analysis.models.sweep_results import measure_phases
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Marker, SourceDescriptor

pytestmark = pytest.mark.fast

POWER_W = 700.0


def _counter_j(t_s, grid_phase_s):
    """What a 100 ms counter shows at t: the energy up to its last update."""
    last_update_s = grid_phase_s + 0.1 * np.floor((t_s - grid_phase_s) / 0.1)
    return 1000.0 + POWER_W * last_update_s


def _in_step_reads(grid_phase_s, late_read=None, late_s=0.006):
    """Reads every 100 ms, 4 ms before each update; one of them ``late_s`` late."""
    reads_s = grid_phase_s - 0.004 + 0.1 * np.arange(1, 21)
    if late_read is not None:
        reads_s[late_read] += late_s
    return reads_s, _counter_j(reads_s, grid_phase_s)


@pytest.mark.parametrize("grid_phase_s", [0.0123, 0.0502, 0.0991, 0.0003])
def test_a_read_that_crosses_an_update_pins_the_grid(grid_phase_s):
    reads_s, values = _in_step_reads(grid_phase_s, late_read=7)
    phase = update_phase_s(reads_s, values)
    assert phase is not None
    off = (phase - grid_phase_s + 0.05) % 0.1 - 0.05  # distance on the circle
    assert abs(off) < 0.002
    placed_s, placed_j = at_updates(reads_s, values)
    assert np.all(np.diff(placed_s) > 0)
    # each value now sits at its update (to the phase found): the energy up to that time
    np.testing.assert_allclose(placed_j, 1000.0 + POWER_W * placed_s, atol=POWER_W * 0.002)


def test_a_short_window_across_the_crossing_is_exact_once_placed():
    reads_s, values = _in_step_reads(0.05, late_read=7)
    window = (reads_s[6] + 0.01, reads_s[6] + 0.11)  # 0.1 s at 700 W: 70 J
    raw = np.diff(np.interp(window, reads_s, values))[0]
    placed = np.diff(np.interp(window, *at_updates(reads_s, values)))[0]
    assert abs(raw - 70.0) > 30.0  # the late read put a second update in one interval
    assert placed == pytest.approx(70.0, abs=1.0)


@pytest.mark.parametrize("reads_s", [np.array([0.0, 9.0, 18.0, 27.0, 30.0]),
                                     0.096 + 0.1 * np.arange(20)])
def test_reads_that_do_not_pin_the_grid_are_kept_as_read(reads_s):
    values = _counter_j(reads_s, 0.0)
    assert update_phase_s(reads_s, values) is None
    placed_s, placed_j = at_updates(reads_s, values)
    assert placed_s is reads_s and placed_j is values


def test_reads_no_grid_fits_are_kept_as_read():
    # the same value over more than a period: no 100 ms grid explains it (a stuck counter)
    reads_s = np.array([0.0, 0.05, 0.3, 0.35])
    values = np.array([1.0, 1.0, 1.0, 2.0])
    assert update_phase_s(reads_s, values) is None
    assert update_phase_s(reads_s[:1], values[:1]) is None


def _sweep_like_run(tmp_path):
    """A counter read in step with its updates, one read late across one, and a 0.1 s phase
    on the crossing, as a sweep run records it."""
    reads_s, values = _in_step_reads(0.05, late_read=7)
    path = tmp_path / "ticks.h5"
    w = RunFileWriter(str(path), {}, 0)
    w.add_source(SourceDescriptor("gpu0.energy", "nvml", "g", (Channel("energy_j", "J"),)))
    t_ns = np.round(reads_s * 1e9).astype(np.int64)
    w.append("gpu0.energy", t_ns, t_ns, values.reshape(-1, 1), np.zeros(t_ns.size, np.uint8))
    a_ns, b_ns = round((reads_s[6] + 0.01) * 1e9), round((reads_s[6] + 0.11) * 1e9)
    w.add_markers([Marker(a_ns, "load", "begin", "pid1"), Marker(b_ns, "load", "end", "pid1")])
    w.close()
    return path


def test_sweep_phases_and_energy_report_use_the_placed_reads(tmp_path):
    path = _sweep_like_run(tmp_path)
    (load,) = measure_phases(str(path), 0)
    assert load.energies_j["nvml_energy"] == pytest.approx(70.0, abs=1.0)
    with wattlab.open(str(path)) as run:
        rows = energy_report(run, by_marker=True)["rows"]
    row = next(r for r in rows if r["source"] == "gpu0.energy" and r["phase"] == "load")
    assert row["energy_j"] == pytest.approx(70.0, abs=1.0)
