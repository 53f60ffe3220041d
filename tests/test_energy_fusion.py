"""Deconvolved NVML energy: exact on data built by the kernel, within 1 % on a real H100
trace's phases of 2 s or more, and refused with a reason where the windows are not known."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import wattlab
from tests.data_files import DATA
from wattlab.analysis.calibration.deconvolved_energy import Windows, fuse, fuse_records, mark_breaks
from wattlab.analysis.calibration.stream_calibration import calibrate
from wattlab.analysis.energy.source_energy import energy_report, phases_from_markers
from wattlab.errors import UsageError
from wattlab.runfile import CalibrationRecord, Identifiability

TRACE = DATA / "traces" / "h100_torch-long.h5"
AVERAGE = "gpu0.power:average_power_w"
INSTANT = "gpu0.power:instant_power_w"
PERIOD_S, WIDTH_S = 0.1, 1.0


def _boxcar_readings(levels_w: np.ndarray, step_s: float, ends_s: np.ndarray) -> np.ndarray:
    """Exact 1 s means of piecewise-constant power (``levels_w`` per ``step_s``) ending at each."""
    edges = np.arange(levels_w.size + 1) * step_s
    cum = np.concatenate(([0.0], np.cumsum(levels_w) * step_s))
    return (np.interp(ends_s, edges, cum) - np.interp(ends_s - WIDTH_S, edges, cum)) / WIDTH_S


def _windows(ends_s: np.ndarray, power_w: np.ndarray) -> Windows:
    return Windows("gpu0.power:average_power_w", ends_s, WIDTH_S, power_w, (1.0, 0.0),
                   (0.0, 0.0), 0.0)


@pytest.mark.fast
def test_piecewise_constant_power_is_recovered_from_its_one_second_means() -> None:
    rng = np.random.default_rng(7)
    # levels held 0.3-2.5 s on a 20 ms grid: idle, half and full load
    holds = np.repeat(rng.choice([70.0, 380.0, 690.0], 40), rng.integers(15, 125, 40))
    ends = np.arange(12, holds.size * 0.02 / PERIOD_S) * PERIOD_S
    fusion = fuse([_windows(ends, _boxcar_readings(holds, 0.02, ends))], period_s=PERIOD_S)
    edges = np.arange(holds.size + 1) * 0.02
    cum = np.concatenate(([0.0], np.cumsum(holds) * 0.02))

    def truth(a: float, b: float) -> float:
        return float(np.diff(np.interp([a, b], edges, cum))[0])

    # ends on the lattice, a whole number of windows long: a telescoping sum, exact
    for a, b in ((2.0, 6.0), (3.0, 5.0), (7.3, 10.3)):
        assert fusion.energy_j(a, b)[0] == pytest.approx(truth(a, b), rel=1e-5)
    # anywhere, any length of 2-4 s: what no window tells is the prior's, and se says so
    errors = []
    for _ in range(100):
        a, length = rng.uniform(1.3, ends[-1] - 5.0), rng.uniform(2.0, 4.0)
        energy, se = fusion.energy_j(a, a + length)
        errors.append(abs(energy - truth(a, a + length)) / truth(a, a + length))
        assert abs(energy - truth(a, a + length)) <= 3 * se
    assert np.mean(errors) < 0.01


@pytest.mark.fast
def test_shift_and_scale_misses_what_deconvolution_recovers() -> None:
    """The same readings, energy of one 2 s hold: the boxcar smears it, the fusion does not."""
    holds = np.concatenate([np.full(300, 70.0), np.full(100, 690.0), np.full(300, 70.0)])
    ends = np.arange(12, 140) * PERIOD_S
    readings = _boxcar_readings(holds, 0.02, ends)
    truth = 2.0 * 690.0
    shifted = float(np.sum(readings[(ends - 0.5 >= 6.0) & (ends - 0.5 < 8.0)]) * PERIOD_S)
    fused = fuse([_windows(ends, readings)], period_s=PERIOD_S).energy_j(6.0, 8.0)[0]
    assert abs(shifted - truth) / truth > 0.05
    assert abs(fused - truth) / truth < 0.01


@pytest.fixture(scope="module")
def torch_long() -> CalibrationRecord:
    with wattlab.open(str(TRACE)) as run:
        return calibrate(run, "gpu0.samples", AVERAGE)


@pytest.mark.fast
def test_real_trace_two_second_phases_within_one_percent(torch_long) -> None:
    """torch-long (steps at random 0.3-0.5 s): consecutive steps joined into ≥ 2 s spans."""
    with wattlab.open(str(TRACE)) as run:
        fusion = fuse_records(run, [torch_long])
        steps = sorted((p for p in phases_from_markers(run.markers) if p.name == "truth_step"),
                       key=lambda p: p.t0_s)
        spans, start = [], None
        for p in steps:
            start = p.t0_s if start is None else start
            if p.t1_s - start >= 2.0:
                spans.append((start, p.t1_s))
                start = None
        report = energy_report(run, by_marker=False, reference="gpu0.samples:power_w",
                               calibration=torch_long, windows=spans, fusion=fusion)
    rows = [r for r in report["rows"] if r["phase"].startswith("window")]
    ref = {r["phase"]: r["energy_j"] for r in rows if r["source"] == "gpu0.samples"}
    avg = [r for r in rows if f"{r['source']}:{r['channel']}" == AVERAGE]
    assert len(avg) == len(spans) >= 4
    errors = [abs(r["corrected_j"] - ref[r["phase"]]) / ref[r["phase"]] for r in avg]
    assert np.mean(errors) < 0.01
    assert all("deconvolved" in " ".join(r["notes"]) for r in avg)
    assert all(r["corrected_se_j"] > 0 for r in avg)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wattlab.cli", "energy", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.system
def test_cli_deconvolves_and_refuses_records_without_windows(torch_long, tmp_path: Path):
    good = tmp_path / "avg.json"
    good.write_text(json.dumps(torch_long.to_json()))
    done = _cli(str(TRACE), "--calibration", str(good), "--deconvolve",
                "--reference", "gpu0.samples")
    assert done.returncode == 0, done.stderr
    assert "energy deconvolved on a 20 ms grid" in done.stdout
    first_order = tmp_path / "lag.json"
    first_order.write_text(json.dumps({**torch_long.to_json(), "kernel": "first_order"}))
    refused = _cli(str(TRACE), "--calibration", str(first_order), "--deconvolve")
    assert refused.returncode == 2
    assert "not a window" in refused.stderr
    no_lattice = tmp_path / "seen.json"
    no_lattice.write_text(json.dumps({**torch_long.to_json(), "update_times": "first_seen"}))
    refused = _cli(str(TRACE), "--calibration", str(no_lattice), "--deconvolve")
    assert refused.returncode == 2
    assert "first-seen times" in refused.stderr and "update lattice" in refused.stderr
    assert _cli(str(TRACE), "--deconvolve").returncode == 2
    without = _cli(str(TRACE), "--calibration", str(good), "--steps-at-marks")
    assert without.returncode == 2 and "--deconvolve" in without.stderr
    marked = _cli(str(TRACE), "--calibration", str(good), "--deconvolve", "--steps-at-marks")
    assert marked.returncode == 0, marked.stderr
    assert "free steps at the marks" in marked.stdout


@pytest.mark.fast
def test_unidentifiable_record_is_refused_unless_forced(torch_long) -> None:
    record = replace(torch_long, verdict=Identifiability(False, ("the width is not pinned",)))
    with wattlab.open(str(TRACE)) as run:
        with pytest.raises(UsageError, match=r"not identifiable.*width is not pinned"):
            fuse_records(run, [record])
        assert fuse_records(run, [record], force=True).power_w.size > 0


@pytest.mark.fast
def test_readings_off_any_lattice_are_refused(torch_long, tmp_path: Path) -> None:
    """A stream whose every poll saw a new value at random times has no update lattice."""
    from tests.sim_runs import sim_descriptor
    from wattlab.runfile.writer import RunFileWriter

    rng = np.random.default_rng(3)
    t_ns = np.cumsum(rng.integers(40, 160, 400)) * 1_000_000
    path = tmp_path / "jitter.h5"
    writer = RunFileWriter(str(path), {}, 0)
    writer.add_source(sim_descriptor("gpu0.power", "nvml", [("average_power_w", "field")]))
    writer.append("gpu0.power", t_ns, t_ns, rng.uniform(60, 700, (t_ns.size, 1)),
                  np.zeros(t_ns.size, np.uint8))
    writer.close()
    with wattlab.open(str(path)) as run, pytest.raises(UsageError, match="not on a periodic"):
        fuse_records(run, [torch_long])


@pytest.mark.fast
def test_a_marked_step_inside_an_update_slice_is_placed_at_its_mark() -> None:
    """Steps 7 ms after marks that fall anywhere in their 100 ms slice: with the marks as
    free steps the holds come out exact, and the lag is found; smoothed across, they do not."""
    rng = np.random.default_rng(11)
    step_s, lag_s = 0.001, 0.007
    marks = np.cumsum(rng.uniform(2.0, 3.0, 14)) + 1.5  # holds of 2-3 s
    t = np.arange(0.0, marks[-1] + 3.0, step_s)
    levels = rng.choice([70.0, 380.0, 690.0], marks.size + 1)
    power = levels[np.searchsorted(marks + lag_s, t + 0.5 * step_s)]
    ends = np.arange(12, int(t[-1] / PERIOD_S)) * PERIOD_S + 0.0137
    readings = _boxcar_readings(power, step_s, ends)
    cum = np.concatenate(([0.0], np.cumsum(power) * step_s))

    def truth(a: float, b: float) -> float:
        return float(np.diff(np.interp([a, b], np.arange(cum.size) * step_s, cum))[0])

    holds = [(a + lag_s, b + lag_s) for a, b in itertools.pairwise(marks[2:-2])]
    smooth = fuse([_windows(ends, readings)], period_s=PERIOD_S)
    marked = fuse([_windows(ends, readings)], period_s=PERIOD_S, breaks_s=marks)
    assert marked.break_lag_s == pytest.approx(lag_s, abs=0.003)
    err_marked = [abs(marked.energy_j(a, b)[0] / truth(a, b) - 1) for a, b in holds]
    err_smooth = [abs(smooth.energy_j(a, b)[0] / truth(a, b) - 1) for a, b in holds]
    # the lag is searched to an eighth of a bin (2.5 ms): what is left is under 1 %
    assert max(err_marked) < 0.01 and np.mean(err_marked) < 0.002
    assert max(err_smooth) > 2 * max(err_marked)
    assert np.mean(err_smooth) > 2 * np.mean(err_marked)
    assert "free steps at the marks" in marked.describe()


EXCITE = DATA / "traces" / "h100_excite-seed1.h5"


@pytest.mark.system
def test_real_excite_holds_with_marks_as_steps() -> None:
    """A real H100 excite run: every hold of 2 s or more, deconvolved with the instant's
    record and the marks as free steps, against the 50 Hz buffer. Its mean is within 1 %,
    and each hold's error within 3 stated se (a single hold is not always within 1 %: the
    two meters disagree by ~1 % even over spans the deconvolution gets exactly)."""
    with wattlab.open(str(EXCITE)) as run:
        records = [calibrate(run, "gpu0.samples", ch) for ch in (AVERAGE, INSTANT)]
        fusion = fuse_records(run, records, breaks_s=mark_breaks(run))
        report = energy_report(run, reference="gpu0.samples:power_w",
                               calibration=records[0], fusion=fusion)
    holds = [r for r in report["rows"] if r["phase"].startswith("excite")
             and r["t1_s"] - r["t0_s"] >= 2.0]
    ref = {r["phase"]: r["energy_j"] for r in report["rows"] if r["source"] == "gpu0.samples"}
    avg = [r for r in holds if f"{r['source']}:{r['channel']}" == AVERAGE]
    assert len(avg) >= 5
    errors = np.array([r["corrected_j"] - ref[r["phase"]] for r in avg])
    se = np.array([r["corrected_se_j"] for r in avg])
    before = np.array([abs(r["energy_j"] - ref[r["phase"]]) for r in avg])
    rel = np.abs(errors) / np.array([ref[r["phase"]] for r in avg])
    assert np.mean(rel) < 0.01
    assert np.all(np.abs(errors) <= 3 * se)
    assert np.mean(np.abs(errors)) < 0.2 * np.mean(before)
    assert 0.0 < fusion.break_lag_s < 0.05  # the reference steps after the CUDA-event marks
