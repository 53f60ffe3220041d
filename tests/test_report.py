"""HTML report: phases from markers, streamed energy per phase, figures, the page itself."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from wattlab.analysis.report import (
    build_report,
    cumulative_energy_j,
    phase_energy,
    phases_from_markers,
    row_at,
)
from wattlab.analysis.run_file import MarkerRow, Run
from wattlab.cli import main
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor
from wattlab.sync.run_writer import RunFileWriter

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


@pytest.fixture(scope="module")
def run_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "run.h5"
    write_synthetic_run(path)
    return path


def test_phases_pair_by_name_and_nest() -> None:
    rows = [MarkerRow(t, name, kind, "w", {}) for t, name, kind in [
        (0, "epoch", "begin"), (1, "step", "begin"), (2, "step", "end"), (3, "step", "begin"),
        (4, "step", "end"), (5, "epoch", "end"), (6, "orphan", "end"), (7, "open", "begin"),
        (8, "tick", "point")]]
    found = phases_from_markers(rows)
    assert [(p.name, p.start_ns, p.end_ns, p.depth) for p in found.phases] == [
        ("epoch", 0, 5, 0), ("step", 1, 2, 1), ("step", 3, 4, 1)]
    assert [m.name for m in found.points] == ["tick"]
    assert any("'orphan'" in w and "no begin" in w for w in found.warnings)
    assert any("'open'" in w and "never ends" in w for w in found.warnings)


def test_cumulative_energy_is_exact_and_never_bridges_a_hole(run_path: Path) -> None:
    with Run(str(run_path)) as run:
        view = run.source("ps3")
        times = np.array([0.5, 0.9, 3.9, 4.4, 7.0], dtype=float) * S
        energy, covered = cumulative_energy_j(view, "power_total_w", times.astype(np.int64))
    # 0.5 .. 0.9 s is one step at 300 W
    assert energy[1] - energy[0] == pytest.approx(300.0 * 0.4, rel=1e-3)
    # across the hole: only 0.2 s of the 0.5 s interval is observed
    assert covered[3] - covered[2] == pytest.approx(0.2, abs=2e-4)
    assert energy[4] == pytest.approx(energy[-1])  # after the stream: the total


def test_phase_energy_per_source(run_path: Path) -> None:
    with Run(str(run_path)) as run:
        phases = phases_from_markers(run.markers).phases
        result = phase_energy(run, phases)
        rows = {r["phase"]: r for r in result.by_name()}
    ps3 = result.sources.index("ps3:power_total_w")
    nvml = result.sources.index("gpu0.samples:power_w")
    counter = result.sources.index("gpu0.energy:energy_j")
    assert rows["step"]["instances"] == 6
    # the last step (4.0 .. 4.4 s) overlaps the 0.3 s hole: only observed time counts
    assert rows["step"]["energy_j"][ps3] == pytest.approx((6 * 0.4 - 0.3) * 300.0, rel=2e-3)
    assert rows["step"]["coverage"][ps3] == pytest.approx(2.1 / 2.4, abs=1e-3)
    assert rows["step"]["energy_j"][nvml] == pytest.approx(0.95 * 6 * 0.4 * 300.0, rel=0.03)
    assert rows["validation"]["energy_j"][ps3] == pytest.approx(2 * 0.4 * 200.0, rel=2e-3)
    assert rows["session"]["energy_j"][counter] == pytest.approx(150.0 * 5.85, rel=1e-6)
    assert rows["session"]["coverage"][counter] == pytest.approx(5.85 / 5.9, rel=1e-6)
    assert rows["session"]["coverage"][ps3] == pytest.approx(5.6 / 5.9, abs=1e-3)
    assert rows["validation"]["coverage"][ps3] == pytest.approx(1.0, abs=1e-3)


def test_row_at_bisects(run_path: Path) -> None:
    with Run(str(run_path)) as run:
        view = run.source("gpu0.samples")
        assert row_at(view, 0) == 0
        assert row_at(view, int(0.021 * S)) == 2
        assert row_at(view, 10 * S) == len(view)


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
                 "gpu0.energy:energy_j", "95%"):
        assert text in page, text


def test_stored_calibration_results_get_a_panel(run_path: Path, tmp_path: Path) -> None:
    copy = tmp_path / "cal.h5"
    copy.write_bytes(run_path.read_bytes())
    with h5py.File(copy, "r+") as f:
        g = f.create_group("analysis/calibration/gpu0")
        ref = np.linspace(100, 300, 50)
        g["reference_w"] = ref
        g["target_w"] = 0.95 * ref + 3
        g["corrected_w"] = ref + 0.5
        g.attrs["gain"] = 0.95
        g.attrs["reference"] = "ps3"
    result = build_report(str(copy), str(tmp_path / "cal.html"))
    assert any(p.endswith("cal_calibration_gpu0.png") for p in result.png_paths)
    assert not any(n.startswith("NVML calibration") for n in result.notes)


def test_cli_report_and_bad_input(run_path: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    assert main(["report", str(run_path), "-o", str(out)]) == 0
    assert out.exists() and (tmp_path / "cli_timeline.png").exists()
    assert f"report: {out}" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing.h5")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["report", str(run_path), "-o", str(tmp_path / "no" / "x.html")]) == 2


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
