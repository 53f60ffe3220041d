"""Energy per source and phase: exact on known streams, gaps reported and never bridged."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattlab
from wattlab.analysis.alignment import bin_means, cumulative_at
from wattlab.analysis.energy import energy_report, phases_from_markers
from wattlab.cli import main
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor
from wattlab.sync.run_writer import RunFileWriter

MS = 1_000_000


def _add(writer, sid, kind, t_ns, values, unit="W", name="power_w"):
    writer.add_source(SourceDescriptor(sid, kind, "m", (Channel(name, unit),)))
    writer.append(sid, t_ns, t_ns, np.asarray(values, float).reshape(-1, 1),
                  np.zeros(t_ns.size, np.uint8))


@pytest.fixture()
def gap_run(tmp_path):
    """meter: 100 W for 4 s then 200 W for 6 s at 1 kHz, with 1 s missing inside phase b;
    nvml: 5 % high at 50 Hz, no gap; counter: exact J counter at 10 Hz."""
    path = tmp_path / "gap.h5"
    w = RunFileWriter(str(path), {}, 0)
    t = np.arange(0, 10_001) * MS
    p = np.where(t < 4_000 * MS, 100.0, 200.0)
    keep = (t < 6_000 * MS) | (t > 7_000 * MS)
    _add(w, "meter", "meter", t[keep], p[keep])
    t2 = np.arange(0, 501) * 20 * MS
    _add(w, "gpu", "nvml", t2, 1.05 * np.where(t2 < 4_000 * MS, 100.0, 200.0))
    t3 = np.arange(0, 101) * 100 * MS
    e = np.where(t3 < 4_000 * MS, 100.0 * t3 / 1e9, 400 + 200.0 * (t3 / 1e9 - 4))
    _add(w, "counter", "nvml", t3, e + 12345.0, unit="J", name="energy_j")
    w.add_gaps([Gap("meter", "test hole", 10, 12, 6_000 * MS, 7_001 * MS, 1000)])
    w.add_markers([Marker(0, "a", "begin"), Marker(4_000 * MS, "a", "end"),
                   Marker(4_000 * MS, "b", "begin"), Marker(10_000 * MS, "b", "end")])
    w.close()
    return path


def _row(report, source, phase):
    return next(r for r in report["rows"] if r["source"] == source and r["phase"] == phase)


def test_energy_per_phase_is_exact_and_the_gap_widens_the_interval(gap_run):
    with wattlab.open(str(gap_run)) as run:
        rep = energy_report(run, by_marker=True)
    assert rep["reference"] == "meter:power_w"
    a = _row(rep, "meter", "a")
    assert a["energy_j"] == pytest.approx(400.0, rel=1e-3)
    assert a["uncovered_s"] == pytest.approx(0.0, abs=1e-9) and a["gaps"] == 0
    b = _row(rep, "meter", "b")
    assert b["uncovered_s"] == pytest.approx(1.0, abs=0.01)
    assert b["gaps"] == 1 and any("not bridged" in n for n in b["notes"])
    assert b["measured_j"] == pytest.approx(1000.0, rel=2e-3)  # 5 s of 200 W, hole left out
    assert b["low_j"] <= 1200.0 <= b["high_j"]
    assert b["uncertainty_j"] > a["uncertainty_j"]
    assert _row(rep, "gpu", "b")["error_pct"] == pytest.approx(5.0, abs=0.3)
    c = _row(rep, "counter", "b")
    assert c["method"] == "counter" and c["energy_j"] == pytest.approx(1200.0, rel=1e-6)


def test_chunked_integration_equals_whole():
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.uniform(0.5e-3, 1.5e-3, 20_000))
    v = rng.uniform(0, 500, t.size)
    q = np.linspace(t[0], t[-1], 77)
    whole = cumulative_at([(t, v)], q, 1.0)
    chunks = [(t[i:i + 999], v[i:i + 999]) for i in range(0, t.size, 999)]
    parts = cumulative_at(chunks, q, 1.0)
    np.testing.assert_allclose(parts.integral, whole.integral, rtol=1e-12)
    assert whole.integral[-1] == pytest.approx(np.trapezoid(v, t), rel=1e-12)


def test_bin_means_are_nan_across_a_hole():
    t = np.concatenate([np.arange(0, 1, 1e-3), np.arange(2, 3, 1e-3)])
    cum = cumulative_at([(t, np.full(t.size, 7.0))], np.arange(0, 3.01, 0.25), 0.01)
    means = bin_means(cum)
    assert np.all(np.isnan(means[3:8])) and np.allclose(means[:3], 7.0)
    assert cum.n_gaps == 1


def test_phases_pair_begin_and_end_per_name_with_repeats():
    rows = [wattlab.analysis.run_file.MarkerRow(t, n, k, "w", {}) for t, n, k in [
        (0, "x", "begin"), (10, "y", "begin"), (20, "y", "end"), (30, "x", "end"),
        (40, "x", "begin"), (50, "x", "end"), (60, "z", "begin")]]
    phases = phases_from_markers(rows)
    assert [(p.label, round(p.t0_s * 1e9), round(p.t1_s * 1e9)) for p in phases] == [
        ("x", 0, 30), ("y", 10, 20), ("x#1", 40, 50)]


def test_cli_energy_json_and_table(gap_run, capsys):
    assert main(["energy", str(gap_run), "--by-marker", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert {r["phase"] for r in rep["rows"]} == {"run", "a", "b"}
    assert main(["energy", str(gap_run)]) == 0
    out = capsys.readouterr().out
    assert "meter:power_w" in out and "err %" in out


def test_energy_of_a_demo_run_has_every_nvml_view(tmp_path):
    out = tmp_path / "demo.h5"
    assert main(["demo", "--duration", "2", "-o", str(out)]) == 0
    with wattlab.open(str(out)) as run:
        rep = energy_report(run, by_marker=True)
    streams = {(r["source"], r["channel"]) for r in rep["rows"] if r["phase"] == "run"}
    assert {("gpu0.samples", "power_w"), ("gpu0.power", "average_power_w"),
            ("gpu0.energy", "energy_j")} <= streams
    assert ("gpu0.state", "power_limit_w") not in streams
    run_rows = {r["source"]: r for r in rep["rows"] if r["phase"] == "run"
                and r["source"] in ("gpu0.samples", "gpu0.energy")}
    samples, counter = run_rows["gpu0.samples"], run_rows["gpu0.energy"]
    # the counter is read ~1 Hz: its edges are known only to within its stated uncertainty
    assert abs(counter["energy_j"] - samples["energy_j"]) < (
        counter["uncertainty_j"] + 0.05 * samples["energy_j"])
    assert rep["reference"] is not None  # the demo's emulated meter
