"""Calibration says when its data cannot pin the kernel, on real H100 recordings with known
loads: a 1 Hz square wave (a 1 s boxcar averages it flat) and steps one second apart are not
identifiable; steps at random intervals are, at the H100's 1 s boxcar and 0.5 s delay."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

import wattlab
from tests.data_files import DATA
from wattlab.analysis.calibration.identifiability import Profile, effective_points, judge
from wattlab.analysis.calibration.stream_calibration import calibrate, load_record
from wattlab.errors import UsageError
from wattlab.runfile import CalibrationRecord

TRACES = DATA / "traces"
AVERAGE = "gpu0.power:average_power_w"


def record_of(trace: str) -> CalibrationRecord:
    with wattlab.open(str(TRACES / f"h100_{trace}.h5")) as run:
        return calibrate(run, "gpu0.samples", AVERAGE)


@pytest.fixture(scope="module")
def square() -> CalibrationRecord:
    return record_of("square-1hz")


@pytest.mark.system
def test_a_square_wave_at_the_kernels_width_is_not_identifiable(square):
    verdict = square.verdict
    assert verdict.identifiable is False
    assert any("not pinned" in w for w in verdict.warnings)
    assert "repeats every 1.00 s" in verdict.advice
    assert "wattlab excite" in verdict.advice
    # no confident width or delay: the uncertainty is open, not ±5 ms
    assert square.effective_delay_s.se is None
    assert square.profiles is not None
    assert math.isnan(square.profiles.effective_delay_range[1] or math.nan)


@pytest.mark.system
def test_steps_one_second_apart_are_not_identifiable_either():
    lightning = record_of("lightning")  # loader-bound: a step every 1.00 s (IQR 0.93-1.07)
    assert lightning.verdict.identifiable is False
    assert lightning.verdict.warnings


@pytest.mark.system
def test_steps_at_random_intervals_pin_the_h100_boxcar():
    rec = record_of("torch-long")  # steps 0.3-0.5 s apart at random, eval passes
    assert rec.verdict.identifiable is True, rec.verdict.warnings
    assert rec.verdict.warnings == ()
    width, eff = rec.params.width, rec.effective_delay_s
    assert rec.kernel == "boxcar" and rec.params.width_name == "w_s"
    assert width.value == pytest.approx(1.0, abs=0.05)
    assert eff.value == pytest.approx(0.5, abs=0.05)
    # the stated uncertainty covers the profile interval, and is not open
    assert rec.profiles is not None
    low, high = rec.profiles.width_range
    assert low <= width.value <= high
    assert 0 < width.se < 0.05
    assert rec.update_period_s == pytest.approx(0.100, abs=0.005)  # from 90 ms polls


@pytest.mark.system
def test_energy_refuses_a_calibration_that_cannot_know(tmp_path, square):
    path = tmp_path / "square.json"
    path.write_text(json.dumps(square.to_json()))
    with pytest.raises(UsageError, match="not identifiable"):
        load_record(str(path))
    assert load_record(str(path), force=True).verdict.identifiable is False
    run = tmp_path / "run.h5"
    shutil.copy(TRACES / "h100_square-1hz.h5", run)
    cli = [sys.executable, "-m", "wattlab.cli", "energy", str(run), "--calibration", str(path)]
    refused = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "not identifiable" in refused.stderr and "--force-calibration" in refused.stderr
    forced = subprocess.run([*cli, "--force-calibration"], capture_output=True, text=True,
                            timeout=60)
    assert forced.returncode == 0, forced.stderr


@pytest.mark.system
def test_calibrate_says_so_in_text_and_marks_the_stored_record(tmp_path):
    run = tmp_path / "run.h5"
    shutil.copy(TRACES / "h100_square-1hz.h5", run)
    done = subprocess.run([sys.executable, "-m", "wattlab.cli", "calibrate", str(run),
                           "--reference", "gpu0.samples", "--target", AVERAGE],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "NOT IDENTIFIABLE" in done.stdout and "fix:" in done.stdout
    assert "not pinned by this data" in done.stdout
    import h5py

    with h5py.File(run, "r") as f:
        assert bool(f[f"analysis/calibration/{AVERAGE}"].attrs["identifiable"]) is False


def profile(low: float, high: float, connected: bool = True) -> Profile:
    return Profile(low, high, connected)


@pytest.mark.fast
def test_judge_names_each_reason():
    good = judge(profile(0.99, 1.01), profile(0.49, 0.51), width_scale_s=1.0, r2=0.999,
                 gain=1.0, gain_se=0.005, repeat_hz=math.nan, repeat_share=0.0)
    assert good.identifiable and not good.warnings
    assert good.se_floor["w"] == pytest.approx(0.01 / 1.96)
    bad = judge(profile(math.nan, 2.0), profile(0.2, 0.9, connected=False),
                width_scale_s=1.0, r2=0.5, gain=1.0, gain_se=0.2, repeat_hz=1.0,
                repeat_share=0.8)
    assert not bad.identifiable
    assert len(bad.warnings) == 4
    assert math.isinf(bad.se_floor["w"]) and math.isinf(bad.se_floor["eff"])
    assert "repeats every 1.00 s" in bad.advice


@pytest.mark.fast
def test_effective_points_shrink_with_autocorrelation():
    rng = np.random.default_rng(0)
    white = rng.normal(size=2000)
    smooth = np.convolve(white, np.ones(10) / 10, mode="valid")
    assert effective_points(white) > 1500
    assert effective_points(smooth) < 400


@pytest.mark.system
def test_calibration_reports_the_energy_error_by_phase_length_and_the_report_shows_it():
    from wattlab.analysis.report.html_report import calibration_caveats

    rec = record_of("torch-long")
    rows = {r.length_s: r.rms_error_after_pct for r in rec.energy.by_length}
    assert {0.5, 1.0, 2.0, 5.0, 10.0} <= set(rows)
    # a 1 s average cannot resolve short phases; long ones come out right
    assert rows[0.5] > 5 * rows[10.0]
    assert rows[10.0] < 1.0
    text = calibration_caveats(rec)
    assert "observes 100 % of the time" in text and "10 s:" in text
    assert "NOT IDENTIFIABLE" in calibration_caveats(record_of("square-1hz"))


# system: over a second (a calibration fitted), as the test above
@pytest.mark.system
def test_the_reports_calibration_line_carries_the_validity_verdict():
    """Issue 37: every figure carries its verdict; the report's calibration line lacked it."""
    from dataclasses import replace

    from wattlab.analysis.report.html_report import calibration_caveats

    rec = record_of("torch-long")
    assert rec.validity is not None and rec.validity.valid
    assert f"valid: all {len(rec.validity.figures)} figures passed" in calibration_caveats(rec)
    first = rec.validity.figures[0]
    cut = replace(first, valid=False, checks={**first.checks, "coverage": {
        **first.checks["coverage"], "ok": False}})
    broken = replace(rec, validity=replace(rec.validity, valid=False, invalid_figures=1,
                                           figures=[cut, *rec.validity.figures[1:]]))
    assert (f"NOT VALID: 1 of {len(rec.validity.figures)} figures failed their checks: "
            f"{first.figure} (coverage)") in calibration_caveats(broken)
    assert "validity not judged" in calibration_caveats(replace(rec, validity=None))
