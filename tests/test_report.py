"""HTML report: phases, energy per phase (as `wattlab energy`), calibration, sweep models.

Real run and sweep files written by wattlab's own writers; the page and its PNGs are read
back. Nothing here needs a browser.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from wattlab.analysis.models.energy_models import fit_sweep
from wattlab.analysis.models.sweep_results import SweepTable, read_sweep, write_sweep
from wattlab.analysis.report.html_report import (
    ReportOptions,
    build_report,
    family_curves,
    phase_marks,
    row_at,
)
from wattlab.cli import main
from wattlab.runfile import TargetStream
from wattlab.runfile.reader import MarkerRow, Run
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor

T0 = 1_000_000_000_000
S = 1_000_000_000
PS3_RATE_HZ = 20_000
HOLE = (4.0, 4.3)  # seconds with no ps3 samples (and a gap record)


def ps3_power_w(t_s: np.ndarray) -> np.ndarray:
    """100 W idle, 300 W in steps of epochs, 200 W in validation (see the markers below)."""
    p = np.full(t_s.shape, 100.0)
    for e in range(2):
        for k in range(3):
            start = 0.5 + e * 2.5 + k * 0.5
            p[(t_s >= start) & (t_s < start + 0.4)] = 300.0
        p[(t_s >= 2.0 + e * 2.5) & (t_s < 2.4 + e * 2.5)] = 200.0
    return p


def write_synthetic_run(path: Path) -> None:
    writer = RunFileWriter(str(path), {"command": '["python", "train.py"]', "host": "bench"}, T0)
    writer.add_source(SourceDescriptor("ps3", "powersensor3", "PowerSensor3",
                                       (Channel("power_total_w", "W"),), value_dtype="<f4"))
    writer.add_source(SourceDescriptor("gpu0.samples", "nvml", "Simulated GPU",
                                       (Channel("power_w", "W"),)))
    writer.add_source(SourceDescriptor("gpu0.energy", "nvml", "Simulated GPU",
                                       (Channel("energy_j", "J"),)))
    t_s = np.arange(0, 6.0, 1 / PS3_RATE_HZ)
    t_s = t_s[(t_s < HOLE[0]) | (t_s >= HOLE[1])]
    p = ps3_power_w(t_s)
    for part in np.array_split(np.arange(t_s.size), 4):
        t_ns = T0 + np.round(t_s[part] * S).astype(np.int64)
        writer.append("ps3", t_ns, t_ns, p[part, None].astype(np.float32),
                      np.zeros(part.size, np.uint8))
    nv_t = np.arange(0, 6.0, 0.02)
    nv_ns = T0 + np.round(nv_t * S).astype(np.int64)
    writer.append("gpu0.samples", nv_ns, nv_ns, 0.95 * ps3_power_w(nv_t)[:, None],
                  np.zeros(nv_t.size, np.uint8))
    e_t = np.arange(0, 6.0, 0.1)
    e_ns = T0 + np.round(e_t * S).astype(np.int64)
    writer.append("gpu0.energy", e_ns, e_ns, (1000.0 + 150.0 * e_t)[:, None],
                  np.zeros(e_t.size, np.uint8))
    markers = [Marker(T0 + int(0.05 * S), "session", "begin", "session"),
               Marker(T0 + int(5.95 * S), "session", "end", "session")]
    for e in range(2):
        base = 0.5 + e * 2.5
        markers += [Marker(T0 + int(base * S), "epoch", "begin", "pid1", {"epoch": e}),
                    Marker(T0 + int((base + 1.9) * S), "epoch", "end", "pid1")]
        for k in range(3):
            start = base + k * 0.5
            markers += [Marker(T0 + int(start * S), "step", "begin", "pid1"),
                        Marker(T0 + int((start + 0.4) * S), "step", "end", "pid1")]
        markers += [Marker(T0 + int((2.0 + e * 2.5) * S), "validation", "begin", "pid1"),
                    Marker(T0 + int((2.4 + e * 2.5) * S), "validation", "end", "pid1"),
                    Marker(T0 + int((2.45 + e * 2.5) * S), "checkpoint", "point", "pid1")]
    writer.add_markers(markers)
    writer.add_gaps([Gap("ps3", "3 batches lost", 10, 12, T0 + int(HOLE[0] * S),
                         T0 + int(HOLE[1] * S), 6000)])
    writer.close({"session_end_monotonic_ns": T0 + 6 * S})


def _written(factory: pytest.TempPathFactory, name: str, write: Callable[[Path], None]) -> Path:
    path = factory.mktemp(name) / f"{name}.h5"
    write(path)
    return path


@pytest.fixture(scope="module")
def run_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _written(tmp_path_factory, "run", write_synthetic_run)


CAL_GAIN, CAL_OFFSET_W, CAL_WINDOW_S = 0.9, 5.0, 1.0


def write_calibration_run(path: Path) -> None:
    """30 s of a 2 kHz meter and an NVML-like 1 s average (gain 0.9, +5 W, 100 ms updates)."""
    rng = np.random.default_rng(3)
    edges = np.cumsum(rng.uniform(0.4, 2.0, 40))
    levels = rng.uniform(100.0, 600.0, edges.size + 1)

    def truth_w(t_s: np.ndarray) -> np.ndarray:
        return levels[np.searchsorted(edges, t_s, side="right")]

    writer = RunFileWriter(str(path), {"command": '["bench"]'}, T0)
    writer.add_source(SourceDescriptor("ps3", "powersensor3", "PowerSensor3",
                                       (Channel("power_total_w", "W"),)))
    writer.add_source(SourceDescriptor("gpu0.power", "nvml", "Test GPU",
                                       (Channel("average_power_w", "W"),)))
    t_ref = np.arange(0, 30.0, 1 / 2000)
    t_ns = T0 + np.round(t_ref * S).astype(np.int64)
    writer.append("ps3", t_ns, t_ns, truth_w(t_ref)[:, None], np.zeros(t_ref.size, np.uint8))
    fine = np.arange(0, 30.0, 1e-4)
    cum = np.concatenate(([0.0], np.cumsum(truth_w(fine) * 1e-4)))
    updates = np.arange(1.5, 30.0, 0.1)
    mean_w = (np.interp(updates, np.r_[fine, 30.0], cum)
              - np.interp(updates - CAL_WINDOW_S, np.r_[fine, 30.0], cum)) / CAL_WINDOW_S
    polls = np.arange(1.51, 30.0, 0.02)
    held = CAL_GAIN * mean_w[np.searchsorted(updates, polls, side="right") - 1] + CAL_OFFSET_W
    p_ns = T0 + np.round(polls * S).astype(np.int64)
    writer.append("gpu0.power", p_ns, p_ns, held[:, None], np.zeros(polls.size, np.uint8))
    writer.add_markers([Marker(T0 + int(a * S), "load", kind, "pid1")
                        for a, kind in ((6.0, "begin"), (20.0, "end"))])
    writer.close({"session_end_monotonic_ns": T0 + 30 * S})


@pytest.fixture(scope="module")
def cal_run_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _written(tmp_path_factory, "cal", write_calibration_run)


@pytest.mark.fast
def test_phases_pair_by_name_and_nest() -> None:
    rows = [MarkerRow(t, name, kind, "w", {}) for t, name, kind in [
        (0, "epoch", "begin"), (1, "step", "begin"), (2, "step", "end"), (3, "step", "begin"),
        (4, "step", "end"), (5, "epoch", "end"), (6, "orphan", "end"), (7, "open", "begin"),
        (8, "tick", "point")]]
    found = phase_marks(rows)
    assert [(p.label, p.start_s * 1e9, p.end_s * 1e9, p.depth) for p in found.spans] == [
        ("epoch", 0, 5, 0), ("step", 1, 2, 1), ("step", 3, 4, 1)]
    assert [m.name for m in found.points] == ["tick"]
    assert any("'orphan'" in w and "no begin" in w for w in found.warnings)
    assert any("'open'" in w and "never end" in w for w in found.warnings)


@pytest.mark.fast
def test_row_at_bisects(run_path: Path) -> None:
    with Run(str(run_path)) as run:
        view = run.source("gpu0.samples")
        assert row_at(view, 0) == 0
        assert row_at(view, int(0.021 * S)) == 2
        assert row_at(view, 10 * S) == len(view)


@pytest.mark.system
def test_report_is_one_self_contained_page(run_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    result = build_report(str(run_path), str(out))
    page = out.read_text()
    assert result.html_path == str(out)
    names = sorted(Path(p).name for p in result.png_paths)
    assert names == ["page_energy.png", "page_timeline.png", "page_zoom.png"]
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 3
    for b64, png in zip(images, result.png_paths, strict=True):
        data = base64.b64decode(b64)
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert data == Path(png).read_bytes()
    assert "http://" not in page and "https://" not in page and "<script" not in page
    for text in ("Energy per phase", "validation", "3 batches lost", "python train.py",
                 "gpu0.energy:energy_j", "vs ps3:power_total_w (%)"):
        assert text in page, text
    # 6 s of data cannot be calibrated: the page says why instead of an empty panel
    assert any(n.startswith("NVML calibration") and "overlap" in n for n in result.notes)


@pytest.mark.system
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_report_files_get_the_users_umask(run_path: Path, tmp_path: Path, umask: int) -> None:
    """A report is made to be shared: not 0600 (tempfile.mkstemp's mode), the umask's."""
    previous = os.umask(umask)
    try:
        result = build_report(str(run_path), str(tmp_path / "shared.html"),
                              ReportOptions(dpi=30))
    finally:
        os.umask(previous)
    for path in [result.html_path, *result.png_paths]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask, path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        Path(p).name for p in [result.html_path, *result.png_paths])  # no temp file left


@pytest.mark.system
def test_energy_per_phase_is_what_wattlab_energy_says(
        run_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The page's table sums `wattlab energy --by-marker` rows per phase name, exactly."""
    assert main(["energy", str(run_path), "--by-marker", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    result = build_report(str(run_path), str(tmp_path / "e.html"))
    energy = result.energy
    assert energy is not None
    name_of = {p["label"]: p["name"] for p in cli["phases"]}
    expected: dict[tuple[str, str], float] = {}
    for r in cli["rows"]:
        key = (name_of[r["phase"]], f"{r['source']}:{r['channel']}")
        expected[key] = expected.get(key, 0.0) + r["energy_j"]
    assert {"run", "step", "epoch", "validation", "session"} <= set(energy.phases)
    for (phase, stream), value in expected.items():
        got = energy.energy_j[energy.phases.index(phase), energy.streams.index(stream)]
        assert got == pytest.approx(value, rel=1e-12), (phase, stream)
    # the step phase overlaps the 0.3 s ps3 hole: uncovered there, and the page says so
    ps3 = energy.streams.index("ps3:power_total_w")
    assert energy.uncovered_s[energy.phases.index("step"), ps3] == pytest.approx(0.3, abs=1e-3)
    page = (tmp_path / "e.html").read_text()
    step_ps3 = energy.energy_j[energy.phases.index("step"), ps3]
    assert f"<td class=\"\">{step_ps3:.2f}</td>" in page


@pytest.mark.system
def test_calibration_panel_fits_nvml_against_the_meter(cal_run_path: Path,
                                                       tmp_path: Path) -> None:
    result = build_report(str(cal_run_path), str(tmp_path / "cal.html"))
    assert [Path(p).name for p in result.png_paths if "calibration" in Path(p).name] == \
        ["cal_calibration_0.png"]
    (view,) = result.calibrations
    assert view.record.target == TargetStream("gpu0.power", "average_power_w", "W")
    assert not view.stored
    assert view.param("gain") == pytest.approx(CAL_GAIN, abs=0.01)
    assert view.param("offset_w") == pytest.approx(CAL_OFFSET_W, abs=3.0)
    # the scatter: each reading against the meter seen through the fitted 1 s boxcar
    ok = np.isfinite(view.seen_w)
    assert ok.sum() > 150
    residual = view.target_w[ok] - (view.param("gain") * view.seen_w[ok]
                                    + view.param("offset_w"))
    assert np.sqrt(np.mean(residual ** 2)) < 1.0
    spread = np.ptp(view.seen_w[ok])
    assert spread > 200  # the steps are visible, not a single cluster
    page = (tmp_path / "cal.html").read_text()
    assert "NVML calibration: gpu0.power:average_power_w vs ps3:power_total_w" in page
    assert "Fitted for this report" in page
    with h5py.File(cal_run_path, "r") as f:
        assert "analysis" not in f  # the report never writes into the run


@pytest.mark.system
def test_calibration_stored_by_wattlab_calibrate_is_drawn(cal_run_path: Path,
                                                         tmp_path: Path) -> None:
    copy = tmp_path / "stored.h5"
    copy.write_bytes(cal_run_path.read_bytes())
    assert main(["calibrate", str(copy), "--reference", "ps3",
                 "--target", "gpu0.power:average_power_w"]) == 0
    result = build_report(str(copy), str(tmp_path / "stored.html"))
    (view,) = result.calibrations
    assert view.stored
    assert "Stored in the run by wattlab calibrate" in (tmp_path / "stored.html").read_text()
    skipped = build_report(str(copy), str(tmp_path / "none.html"),
                           ReportOptions(calibration=False))
    assert skipped.calibrations == []
    assert not any("calibration" in Path(p).name for p in skipped.png_paths)


def write_sweep_file(path: Path) -> SweepTable:
    """Two workloads over power limits: time ~ 1/limit above a knee, power ~ the limit."""
    rng = np.random.default_rng(5)
    limits = np.repeat(np.arange(150.0, 351.0, 25.0), 2)
    workload, x, runtime, energy = [], [], [], []
    for name, work in (("resnet", 60.0), ("bert", 90.0)):
        t = work / np.minimum(limits, 260.0) * (1 + 0.01 * rng.standard_normal(limits.size))
        p = 0.8 * limits + 40.0
        workload += [name] * limits.size
        x.append(limits)
        runtime.append(t)
        energy.append(t * p)
    table = SweepTable("power_limit_w", workload, np.concatenate(x), np.concatenate(runtime),
                       np.concatenate(energy), energy_source="nvml_energy", default_x=350.0)
    write_sweep(str(path), table)
    return table


@pytest.mark.system
def test_sweep_report_draws_model_curves_and_the_choice(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.h5"
    write_sweep_file(sweep)
    result = build_report(str(sweep), str(tmp_path / "sweep.html"))
    assert sorted(Path(p).name for p in result.png_paths) == ["sweep_models_0.png",
                                                              "sweep_models_1.png"]
    fit = fit_sweep(read_sweep(str(sweep)))
    assert result.fit is not None and result.fit.chosen == fit.chosen
    page = (tmp_path / "sweep.html").read_text()
    assert f"{fit.chosen} (chosen)" in page
    for rec in fit.recommendations:
        assert f"<td class=\"l\">{rec.workload}</td><td class=\"\">{rec.default_x:g}</td>" \
               f"<td class=\"\">{rec.recommended_x:g}</td>" in page
    for score in fit.families:
        assert f"{score.mape['energy']:.2f}" in page or not np.isfinite(score.mape["energy"])
    assert "power limit (W)" in page


@pytest.mark.fast
def test_family_curves_go_through_the_measured_means(tmp_path: Path) -> None:
    table = write_sweep_file(tmp_path / "s.h5")
    rows = np.array([w == "bert" for w in table.workload])
    settings = np.unique(table.x[rows])
    curves = family_curves(table, "bert", ["pchip", "linear", "boosted"], settings)
    assert set(curves) == {"pchip", "linear"}  # boosted has no per-workload curve
    t_mean = np.array([table.runtime_s[rows][table.x[rows] == s].mean() for s in settings])
    np.testing.assert_allclose(curves["pchip"][0], t_mean, rtol=1e-9)
    assert not np.allclose(curves["linear"][0], t_mean, rtol=1e-3)


@pytest.mark.system
def test_cli_report_and_bad_input(run_path: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    assert main(["report", str(run_path), "-o", str(out), "--no-calibration"]) == 0
    assert out.exists() and (tmp_path / "cli_timeline.png").exists()
    assert f"report: {out}" in capsys.readouterr().out
    bad = tmp_path / "bad"
    bad.mkdir()
    junk = bad / "junk.h5"
    with h5py.File(junk, "w") as f:
        f["x"] = np.zeros(3)
    failed = bad / "failed.h5"
    write_sweep(str(failed), SweepTable("power_limit_w", ["w"] * 3, np.array([1.0, 2, 3]),
                                        np.full(3, np.nan), np.full(3, np.nan)))
    for argv, message in (
            (["report", str(tmp_path / "missing.h5")], "no such file"),
            (["report", str(run_path), "-o", str(tmp_path / "no" / "x.html")], "does not exist"),
            (["report", str(junk), "-o", str(bad / "j.html")], "not a wattlab run file"),
            (["report", str(failed), "-o", str(bad / "f.html")], "no finished runs"),
            (["report", str(run_path), "-o", str(run_path)], "is the input file"),
            (["report", str(run_path), "-o", str(bad / "d.html"), "--dpi", "0"], "--dpi")):
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert sorted(p.name for p in bad.iterdir()) == ["failed.h5", "junk.h5"]  # nothing partial
    assert run_path.read_bytes()[:4] == b"\x89HDF"


@pytest.mark.fast
def test_run_without_power_sources_still_reports(tmp_path: Path) -> None:
    path = tmp_path / "state.h5"
    writer = RunFileWriter(str(path), {}, T0)
    writer.add_source(SourceDescriptor("gpu0.state", "nvml", "GPU",
                                       (Channel("sm_clock_hz", "Hz"),)))
    t = T0 + np.arange(5, dtype=np.int64) * S
    writer.append("gpu0.state", t, t, np.ones((5, 1)), np.zeros(5, np.uint8))
    writer.close()
    result = build_report(str(path))
    assert result.html_path == str(tmp_path / "state.html")
    assert any("measures power" in n for n in result.notes)
    assert any(n.startswith("energy per phase: none") for n in result.notes)
    assert result.png_paths == []
