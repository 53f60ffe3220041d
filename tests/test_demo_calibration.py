"""`wattlab demo` end to end: the emulated PowerSensor3 calibrates the simulated NVML views.

The simulator's artefacts are known (``GpuModel``): the averaged reading is a 1 s trailing
boxcar refreshed every 100 ms, the 50 Hz sample buffer averages 20 ms ending 15 ms before
its stamp (effective delay 25 ms), the instant reading covers only the last 25 ms of each
100 ms period, all with gain 1 and no offset. The PowerSensor3 emulator measures the true
power through its own 10-bit sensors and the serial stream, so the recovery is checked
within the figures' own uncertainties plus what the emulated meter's time base allows.
One 24 s demo recording, shipped in tests/data/demo (tests/conftest.py's ``demo_run``),
serves the whole session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wattlab
from wattlab.analysis.calibration.stream_calibration import calibrate
from wattlab.cli import main
from wattlab.hardware.simulated_gpu import GpuModel
from wattlab.runfile import CalibrationRecord

REF = "ps3:power_total_w"
TRUTH = GpuModel()


@pytest.fixture(scope="module")
def average_record(demo_run: Path) -> CalibrationRecord:
    with wattlab.open(str(demo_run)) as run:
        return calibrate(run, REF, "gpu0.power:average_power_w")


def _v(record: CalibrationRecord, name: str) -> tuple[float, float]:
    obj = record.params.by_name().get(name) or getattr(record, name)
    return obj.value, obj.se


@pytest.mark.fast
def test_average_reading_is_a_one_second_boxcar_with_unit_gain(average_record):
    rec = average_record
    assert rec.kernel == "boxcar"
    w, w_se = _v(rec, "w_s")
    assert abs(w - TRUTH.average_window_s) < 3 * w_se + 0.03
    assert abs(_v(rec, "tau_s")[0]) < 0.03  # causal: the window ends at the driver update
    assert 0.45 < _v(rec, "effective_delay_s")[0] < 0.55
    g, g_se = _v(rec, "gain")
    assert 0 < g_se < 0.02 and abs(g - 1) < max(3 * g_se, 0.01)
    c, c_se = _v(rec, "offset_w")
    assert abs(c) < 3 * c_se + 3.0
    assert rec.update_times == "lattice"
    assert rec.update_period_s == pytest.approx(TRUTH.update_period_s, rel=0.02)
    assert rec.coverage == pytest.approx(1.0)
    e = rec.energy
    assert e.phases_considered >= 3
    assert e.mean_abs_error_after_pct < 0.6 * e.mean_abs_error_before_pct


@pytest.mark.system
def test_sample_buffer_lags_about_25_ms(demo_run):
    with wattlab.open(str(demo_run)) as run:
        rec = calibrate(run, REF, "gpu0.samples:power_w")
    assert rec.kernel == "boxcar"
    truth = TRUTH.sample_delay_s + TRUTH.sample_window_s / 2  # 25 ms
    assert abs(_v(rec, "effective_delay_s")[0] - truth) < 0.015
    assert 0.01 < _v(rec, "w_s")[0] < 0.04
    g, g_se = _v(rec, "gain")
    assert abs(g - 1) < max(3 * g_se, 0.01)


@pytest.mark.fast
def test_instant_reading_is_part_time(demo_run):
    with wattlab.open(str(demo_run)) as run:
        rec = calibrate(run, REF, "gpu0.power:instant_power_w", kernels=("boxcar",))
    assert rec.kernel == "part_time"
    assert 0.012 < _v(rec, "w_s")[0] < 0.06  # 25 ms of each 100 ms period
    assert 0.12 < rec.coverage < 0.6
    assert abs(_v(rec, "gain")[0] - 1) < 0.03


def _phase_rows(report: dict[str, Any], source: str, channel: str) -> list[dict[str, Any]]:
    return [r for r in report["rows"] if (r["source"], r["channel"]) == (source, channel)
            and r["phase"] not in ("run", "session") and r["t1_s"] - r["t0_s"] >= 2]


@pytest.mark.fast
def test_energy_by_phase_compares_nvml_with_the_meter_and_correction_helps(
        demo_run, average_record, tmp_path, capsys):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(average_record.to_json()))
    capsys.readouterr()
    assert main(["energy", str(demo_run), "--by-marker", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["energy", str(demo_run), "--by-marker", "--json",
                 "--calibration", str(cal)]) == 0
    corrected = json.loads(capsys.readouterr().out)
    assert plain["reference"] == REF
    names = {p["label"] for p in plain["phases"]}
    assert {"half", "full", "burst"} <= names
    for source, channel in (("gpu0.power", "average_power_w"), ("gpu0.samples", "power_w")):
        rows = _phase_rows(plain, source, channel)
        assert len(rows) >= 4
        assert all(r["error_pct"] is not None and r["uncertainty_j"] is not None
                   for r in rows)
    ref_rows = _phase_rows(plain, "ps3", "power_total_w")
    assert all(r["low_j"] <= r["energy_j"] <= r["high_j"] for r in ref_rows)
    # phases the emulated meter covered (its serial stream loses data under load)
    covered = {r["phase"] for r in _phase_rows(corrected, "ps3", "power_total_w")
               if r["uncovered_s"] < 0.02 * (r["t1_s"] - r["t0_s"])}
    rows = [r for r in _phase_rows(corrected, "gpu0.power", "average_power_w")
            if r["corrected_error_pct"] is not None and r["phase"] in covered]
    assert len(rows) >= 3
    before = np.mean([abs(r["error_pct"]) for r in rows])
    after = np.mean([abs(r["corrected_error_pct"]) for r in rows])
    assert before > 3.0  # the 1 s boxcar smears energy across phase edges
    assert after < 0.6 * before
    whole = next(r for r in corrected["rows"] if r["phase"] == "run"
                 and (r["source"], r["channel"]) == ("gpu0.power", "average_power_w"))
    assert abs(whole["error_pct"]) < 2.0  # over the whole run the views agree
