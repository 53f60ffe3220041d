"""NVML calibration: known artefacts are recovered from synthetic, simulated and real runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import wattlab
from tests.sim_runs import sim_descriptor, write_sim_run
from wattlab.analysis.calibration import fit_uncertainty, kernel_fit
from wattlab.analysis.calibration import stream_calibration as calibration
from wattlab.analysis.calibration.reference_grid import ReferenceGrid
from wattlab.analysis.calibration.stream_calibration import (
    calibrate,
    load_record,
    store_in_run,
)
from wattlab.analysis.energy.source_energy import energy_report
from wattlab.cli import main
from wattlab.runfile import CalibrationRecord, read_calibrations
from wattlab.runfile.writer import RunFileWriter

MS = 1_000_000


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cal") / "sim.h5"
    write_sim_run(path)
    return path


def _v(record: CalibrationRecord, name: str) -> tuple[float, float]:
    obj = record.params.by_name().get(name) or getattr(record, name)
    return obj.value, obj.se


LTI = {"tau": 0.037, "w": 0.8, "g": 1.07, "c": 12.0}
"""The synthetic target: ``1.07·boxcar_0.8s(ref)(t − 37 ms) + 12 W``."""


def _lti_run(path: Path, quiet_s: tuple[float, float] | None = None) -> dict:
    """Calibrate a 60 s synthetic LTI target sampled at 50 Hz against its 1 kHz reference.

    The reference steps between 80, 300 and 650 W every 0.2 s, or holds 300 W over
    ``quiet_s`` (a stretch where nothing tells gain from offset).
    """
    rng = np.random.default_rng(5)
    t_ref = np.arange(0, 60_000) * MS
    levels = np.repeat(rng.choice([80.0, 300.0, 650.0], size=300), 200)[: t_ref.size]
    if quiet_s is not None:
        levels[int(quiet_s[0] * 1000):int(quiet_s[1] * 1000)] = 300.0
    p_ref = levels + rng.normal(0, 5, t_ref.size)
    cum = np.concatenate(([0.0], np.cumsum(p_ref) * 1e-3))
    edges_s = np.arange(t_ref.size + 1) * 1e-3
    t_tgt = np.arange(200, 2950) * 0.02 + 0.0071
    tau, w = LTI["tau"], LTI["w"]
    box = (np.interp(t_tgt - tau, edges_s, cum) - np.interp(t_tgt - tau - w, edges_s, cum)) / w
    y = LTI["g"] * box + LTI["c"] + rng.normal(0, 1.0, t_tgt.size)
    writer = RunFileWriter(str(path), {}, 0)
    writer.add_source(sim_descriptor("ref", "meter", [("power_w", "")]))
    writer.add_source(sim_descriptor("tgt", "nvml", [("power_w", "field")]))
    writer.append("ref", t_ref, t_ref, p_ref.reshape(-1, 1), np.zeros(t_ref.size, np.uint8))
    t_tgt_ns = np.round(t_tgt * 1e9).astype(np.int64)
    writer.append("tgt", t_tgt_ns, t_tgt_ns, y.reshape(-1, 1), np.zeros(y.size, np.uint8))
    writer.close()
    with wattlab.open(str(path)) as run:
        return calibrate(run, "ref", "tgt")


@pytest.mark.fast
def test_synthetic_lti_target_recovers_tau_width_gain_offset(tmp_path):
    rec = _lti_run(tmp_path / "lti.h5")
    assert rec.kernel == "boxcar"
    assert abs(_v(rec, "tau_s")[0] - LTI["tau"]) < 1e-3
    assert abs(_v(rec, "w_s")[0] / LTI["w"] - 1) < 0.05
    g_fit, g_se = _v(rec, "gain")
    c_fit, c_se = _v(rec, "offset_w")
    assert abs(g_fit / LTI["g"] - 1) < 0.01 and abs(g_fit - LTI["g"]) < 3 * g_se + 1e-3
    assert abs(c_fit - LTI["c"]) < 3 * c_se + 0.5
    assert rec.fit.rmse_w < 2.0


@pytest.mark.system
def test_a_quiet_stretch_does_not_inflate_the_gain_uncertainty(tmp_path):
    """Nine quiet seconds (more than one whole block of eight) leave g and c as well known.

    Unweighted batch means let the quiet block's meaningless gain set the standard error.
    """
    busy = _lti_run(tmp_path / "busy.h5")
    quiet = _lti_run(tmp_path / "quiet.h5", quiet_s=(24.0, 33.0))
    for name, truth in (("gain", LTI["g"]), ("offset_w", LTI["c"])):
        value, se = _v(quiet, name)
        assert 0 < se < 3 * _v(busy, name)[1], name
        assert abs(value - truth) < 3 * se + (1e-3 if name == "gain" else 0.5), name


@pytest.mark.fast
def test_simulated_average_is_a_one_second_boxcar_with_unit_gain(sim_run):
    with wattlab.open(str(sim_run)) as run:
        rec = calibrate(run, "meter", "gpu0.power:average_power_w")
    assert rec.kernel == "boxcar"
    assert abs(_v(rec, "w_s")[0] - 1.0) < 0.05
    assert abs(_v(rec, "gain")[0] - 1.0) < 0.01
    assert abs(_v(rec, "tau_s")[0]) < 0.03  # causal boxcar: the window ends at the update
    assert 0.45 < _v(rec, "effective_delay_s")[0] < 0.55
    assert rec.coverage == pytest.approx(1.0)
    assert 0.08 < rec.update_period_s < 0.13
    e = rec.energy
    assert e.phases_considered >= 3
    assert e.mean_abs_error_after_pct < 0.6 * e.mean_abs_error_before_pct
    assert rec.key.nvml_field == "nvmlDeviceGetPowerUsage"


@pytest.mark.fast
def test_simulated_instant_reading_is_part_time(sim_run):
    with wattlab.open(str(sim_run)) as run:
        rec = calibrate(run, "meter", "gpu0.power:instant_power_w", kernels=("boxcar",))
    assert rec.kernel == "part_time"
    assert 0.015 < _v(rec, "w_s")[0] < 0.035  # the simulator observes 25 ms of each 100 ms
    assert 0.15 < rec.coverage < 0.35


@pytest.mark.fast
def test_injected_gain_and_offset_are_recovered_within_their_uncertainty(sim_run):
    with wattlab.open(str(sim_run)) as run:
        rec = calibrate(run, "meter", "gpu0.scaled")
    g, g_se = _v(rec, "gain")
    c, c_se = _v(rec, "offset_w")
    assert 0 < g_se < 0.01 and 0 < c_se < 5
    assert abs(g - 1.07) < max(3 * g_se, 0.005)
    assert abs(c - 5.0) < max(3 * c_se, 1.0)
    assert not rec.power_dependent_gain.warranted


@pytest.mark.fast
def test_h100_average_is_a_one_second_boxcar_lagging_half_a_second(h100_run):
    with wattlab.open(str(h100_run)) as run:
        rec = calibrate(run, "h100.samples", "h100.average")
    assert rec.kernel == "boxcar"
    assert 0.95 < _v(rec, "w_s")[0] < 1.05
    assert -0.05 < _v(rec, "tau_s")[0] < 0.05
    assert 0.45 < _v(rec, "effective_delay_s")[0] < 0.6
    assert abs(_v(rec, "gain")[0] - 1) < 0.01
    e = rec.energy
    assert e.phases_considered >= 20
    assert e.mean_abs_error_after_pct < 0.6 * e.mean_abs_error_before_pct
    assert abs(e.overall.error_before_pct) < 1.0  # the views' means agree within 1 %


@pytest.mark.fast
def test_cli_calibrate_writes_and_stores_a_record_that_energy_applies(sim_run, tmp_path):
    run_copy = tmp_path / "run.h5"
    run_copy.write_bytes(sim_run.read_bytes())
    cal = tmp_path / "cal.json"
    assert main(["calibrate", str(run_copy), "--reference", "meter", "--target",
                 "gpu0.scaled:average_power_w", "-o", str(cal)]) == 0
    record = load_record(str(cal))
    assert [r.key for r in read_calibrations(str(run_copy))] == [record.key]
    assert main(["calibrate", str(run_copy), "--reference", "meter", "--target",
                 "gpu0.scaled", "-o", str(cal)]) == 2  # never overwrites
    with wattlab.open(str(run_copy)) as run:
        report = energy_report(run, by_marker=True, calibration=record)
    rows = [r for r in report["rows"] if r["source"] == "gpu0.scaled"]
    run_row = next(r for r in rows if r["phase"] == "run")
    assert abs(run_row["error_pct"]) > 5  # uncorrected: the injected 7 % gain and 5 W
    ref_j = next(r["energy_j"] for r in report["rows"]
                 if r["source"] == "meter" and r["phase"] == "run")
    assert abs(run_row["corrected_error_pct"]) < 1.0
    assert abs(run_row["corrected_j"] - ref_j) < 3 * run_row["corrected_se_j"]
    inner = [r for r in rows if r["phase"] != "run" and r["corrected_error_pct"] is not None
             and r["t1_s"] - r["t0_s"] >= 2]
    assert inner
    before = np.mean([abs(r["error_pct"]) for r in inner])
    after = np.mean([abs(r["corrected_error_pct"]) for r in inner])
    assert after < 0.6 * before
    # re-storing replaces the record of the same stream
    store_in_run(str(run_copy), record)
    assert len(read_calibrations(str(run_copy))) == 1


@pytest.mark.fast
def test_calibration_json_is_strict_json(sim_run, capsys):
    assert main(["calibrate", str(sim_run), "--reference", "meter", "--target",
                 "gpu0.power:average_power_w", "--json", "--no-store"]) == 0
    record = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert record["format"] == "wattlab-calibration/1"


@pytest.mark.fast
def test_unknown_stream_is_a_usage_error(sim_run):
    assert main(["calibrate", str(sim_run), "--reference", "nope", "--target", "meter",
                 "--no-store"]) == 2


@pytest.mark.system
@pytest.mark.parametrize(("target", "kernels"), [
    ("gpu0.power:average_power_w", ("boxcar", "first_order")),
    ("gpu0.power:instant_power_w", ("boxcar",)),  # part-time: 25 ms, below the search grid
    ("gpu0.scaled", ("boxcar", "first_order")),
])
def test_a_long_recording_searched_on_a_subset_finds_the_same_fit(sim_run, monkeypatch,
                                                                  target, kernels):
    """Past SEARCH_POINTS readings the search runs on every k-th reading and a coarse grid,
    then refines on everything: it must land where the full search does."""
    with wattlab.open(str(sim_run)) as run:
        full = calibrate(run, "meter", target, kernels=kernels)
        for module in (kernel_fit, fit_uncertainty):  # ~400 readings: every 7th
            monkeypatch.setattr(module, "SEARCH_POINTS", 60)
        searched = calibrate(run, "meter", target, kernels=kernels)
    assert searched.kernel == full.kernel
    width = full.params.width_name
    assert abs(_v(searched, "tau_s")[0] - _v(full, "tau_s")[0]) < 1e-3
    assert abs(_v(searched, width)[0] / _v(full, width)[0] - 1) < 0.05
    assert abs(_v(searched, "gain")[0] / _v(full, "gain")[0] - 1) < 0.01
    assert abs(_v(searched, "effective_delay_s")[0] - _v(full, "effective_delay_s")[0]) < 1e-3
    assert searched.fit.rmse_w < 1.01 * full.fit.rmse_w + 1e-9
    assert searched.fit.blocks >= 3


@pytest.mark.fast
@pytest.mark.parametrize("poll_s", [0.02, 0.045, 0.09])
def test_update_lattice_recovers_the_updates_behind_polled_readings(poll_s: float) -> None:
    """Updates every 100.3 ms, polled with jitter; one poll stalls 250 ms; the first reading
    is the value held at the start. The update instants come back within a poll's walk."""
    rng = np.random.default_rng(5)
    period_s, u0_s = 0.1003, 0.0371
    polls = np.cumsum(np.full(2000, poll_s) + rng.uniform(0, 0.002, 2000))
    polls[700:] += 0.25  # a stalled poll
    tick = np.floor((polls - u0_s) / period_s)
    first_seen = np.concatenate(([True], np.diff(tick) > 0))
    x = polls[first_seen]
    found = calibration.update_lattice(x, float(np.median(np.diff(polls))))
    assert found is not None
    updates_s, period_fit_s, delay_s = found
    assert period_fit_s == pytest.approx(period_s, rel=2e-4)
    truth = u0_s + tick[first_seen] * period_s
    err = updates_s[1:] - truth[1:]
    assert np.mean(np.abs(err) < 0.012) > 0.99  # the stalled poll keeps its own time
    assert 0 < delay_s < poll_s


@pytest.mark.fast
def test_update_lattice_refuses_readings_that_are_not_periodic() -> None:
    x = np.cumsum(np.random.default_rng(2).uniform(0.05, 0.3, 200))
    assert calibration.update_lattice(x, 0.02) is None


@pytest.mark.fast
def test_boxcar_lookups_on_a_grid_without_holes_match_the_general_path() -> None:
    # window means by index arithmetic against the clipped, masked general path, and the
    # first-order lookup at bin ends against the series with its first value prepended
    rng = np.random.default_rng(5)
    edges = 12.5 + np.arange(20_001) / 1000.0
    means = rng.uniform(90, 600, edges.size - 1)
    cum = np.concatenate(([0.0], np.cumsum(means / 1000.0)))
    ref = ReferenceGrid(edges, cum, np.zeros(edges.size), means)
    x = np.sort(rng.uniform(15.0, 32.2, 2_000))  # every window inside the grid
    for tau, w in ((0.5, 1.0), (0.0123, 0.0021), (-0.2, 2.4)):
        fast = kernel_fit._boxcar(ref, x, tau, w)
        a, b = x - tau - w, x - tau
        general = (ref.integral(b) - ref.integral(a)) / w
        # the same window energies up to rounding of the running integral's magnitude
        np.testing.assert_allclose(fast * w, general * w, rtol=0, atol=1e-15 * cum[-1])
    # windows that leave the grid take the general path: NaN there, the rest as before
    out = kernel_fit._boxcar(ref, x, 5.0, 1.0)
    assert np.isnan(out[x - 6.0 < edges[0]]).all() and np.isfinite(out[x - 6.0 >= edges[0]]).all()
    y = rng.normal(size=means.size)
    np.testing.assert_array_equal(ref.at_ends(y, x - 0.3),
                                  ref.at(np.concatenate((y[:1], y)), x - 0.3))
