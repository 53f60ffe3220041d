"""Energy per source and phase: exact on known streams, gaps reported and never bridged."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattlab
from wattlab.analysis.alignment import StreamIntegral, bin_means, cumulative_at
from wattlab.analysis.energy.source_energy import (
    COUNTER_UPDATE_S,
    counter_edge_s,
    energy_report,
    phases_from_markers,
)
from wattlab.cli import main
from wattlab.errors import RunFileError, UsageError
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor

pytestmark = pytest.mark.fast

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
    # both edges fall on counter reads: each is off by at most the counter's update period
    assert c["uncertainty_j"] == pytest.approx(200.0 * 2 * COUNTER_UPDATE_S, rel=1e-6)


def test_a_counter_edge_between_reads_is_less_certain_than_one_on_a_read():
    reads = np.array([0.0, 4.5, 9.0])
    assert counter_edge_s(reads, 0.0) == counter_edge_s(reads, 4.5) == COUNTER_UPDATE_S
    assert counter_edge_s(reads, 2.25) == pytest.approx(COUNTER_UPDATE_S + 2.25 * 2.25 / 4.5)
    assert counter_edge_s(reads, 1.0) == pytest.approx(COUNTER_UPDATE_S + 1.0 * 3.5 / 4.5)
    assert counter_edge_s(reads, 9.5) == COUNTER_UPDATE_S  # outside: counted as "outside"


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
    rows = [wattlab.runfile.reader.MarkerRow(t, n, k, "w", {}) for t, n, k in [
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


def test_energy_of_a_demo_run_has_every_nvml_view(demo_run):
    with wattlab.open(str(demo_run)) as run:
        rep = energy_report(run, by_marker=True)
    streams = {(r["source"], r["channel"]) for r in rep["rows"] if r["phase"] == "run"}
    assert {("gpu0.samples", "power_w"), ("gpu0.power", "average_power_w"),
            ("gpu0.energy", "energy_j")} <= streams
    assert ("gpu0.state", "power_limit_w") not in streams
    run_rows = {r["source"]: r for r in rep["rows"] if r["phase"] == "run"
                and r["source"] in ("gpu0.samples", "gpu0.energy")}
    samples, counter = run_rows["gpu0.samples"], run_rows["gpu0.energy"]
    # the run's window starts and ends between counter reads (9 s apart): the recorded
    # samples place both edges, and the two streams agree within the counter's interval
    assert any("placed by gpu0.samples:power_w" in n for n in counter["notes"])
    assert abs(counter["energy_j"] - samples["energy_j"]) < counter["uncertainty_j"]
    assert rep["reference"] is not None  # the demo's emulated meter


def _trapezoid_at(t_s, v, q_s, hold=False):
    """Reference: the running integral at each sample, linear in between (no gaps)."""
    dt = np.diff(t_s)
    seg = v[:-1] * dt if hold else 0.5 * (v[1:] + v[:-1]) * dt
    return np.interp(q_s, t_s, np.concatenate(([0.0], np.cumsum(seg))))


@pytest.mark.parametrize("jitter_ns", [0, 3_000])
@pytest.mark.parametrize("hold", [False, True])
def test_one_pass_over_integer_ns_matches_a_trapezoid_per_channel(jitter_ns, hold):
    rng = np.random.default_rng(7)
    n = 20_000
    t_ns = np.arange(n, dtype=np.int64) * 50_000 + 1_000_000_000
    t_ns += rng.integers(0, jitter_ns + 1, n)  # 20 kHz, exact or jittered
    values = rng.uniform(0, 600, (n, 3)).astype(np.float32)
    t_s = t_ns / 1e9
    q = np.sort(np.concatenate([rng.uniform(t_s[0], t_s[-1], 300), t_s[[0, 998, 999, 5000, -1]],
                                [t_s[0] - 1.0, t_s[-1] + 1.0]]))
    acc = StreamIntegral(q, [2, 0], 1e9, hold=hold, per_s=1e9)
    for i in range(0, n, 999):  # chunk edges fall anywhere, one query on a chunk's first row
        acc.feed(t_ns[i:i + 999], values[i:i + 999])
    for cum, col in zip(acc.result(), [2, 0], strict=True):
        expect = _trapezoid_at(t_s, values[:, col].astype(np.float64), q, hold)
        np.testing.assert_allclose(cum.integral, expect, rtol=1e-11, atol=1e-9)
        assert np.all(cum.uncovered_s == 0) and cum.n_gaps == 0
        assert cum.span_s == (t_s[0], t_s[-1])


def test_a_nan_in_one_channel_is_a_gap_in_that_channel_only():
    t_ns = np.arange(10_001, dtype=np.int64) * 1_000_000  # 1 kHz for 10 s
    values = np.full((t_ns.size, 2), 100.0)
    values[5000, 1] = np.nan
    acc = StreamIntegral([0.0, 4.0, 10.0], [0, 1], 5e6, per_s=1e9)
    for i in range(0, t_ns.size, 4096):
        acc.feed(t_ns[i:i + 4096], values[i:i + 4096])
    clean, holed = acc.result()
    np.testing.assert_allclose(clean.integral, [0.0, 400.0, 1000.0], rtol=1e-12)
    assert clean.n_gaps == 0 and holed.n_gaps == 2  # the two segments touching the NaN
    np.testing.assert_allclose(holed.integral, [0.0, 400.0, 999.8], rtol=1e-12)
    np.testing.assert_allclose(holed.uncovered_s, [0.0, 0.0, 0.002], atol=1e-12)
    with pytest.raises(RunFileError, match="backwards"):
        StreamIntegral([0.0], [0], 1e9, per_s=1e9).feed(t_ns[::-1], values)
    # a slice that says it continues the last one must start with its last row
    acc = StreamIntegral([0.0, 4.0, 10.0], [0, 1], 5e6, per_s=1e9)
    acc.feed(t_ns[:100], values[:100])
    with pytest.raises(UsageError, match="continues"):
        acc.feed(t_ns[100:200], values[100:200], continues=True)
    acc.feed(t_ns[99:], values[99:], continues=True)
    np.testing.assert_allclose(acc.result()[0].integral, clean.integral, rtol=1e-12)


def _power_profile_w(t_s):
    """100 W until 5 s, 400 W until 12 s, 150 W after: a step the counter reads miss."""
    return np.where(t_s < 5, 100.0, np.where(t_s < 12, 400.0, 150.0))


def _true_energy_j(t_s):
    return (100.0 * np.minimum(t_s, 5) + 400.0 * np.clip(t_s - 5, 0, 7)
            + 150.0 * np.maximum(t_s - 12, 0))


def _shaped_run(tmp_path, *, sample_gain=lambda p: 1.04 * p, samples_uuid="GPU-a",
                drop_s=None):
    """A GPU counter read every 9 s (and at the end) plus its 50 Hz samples, 4 % high."""
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "shaped.h5"
    w = RunFileWriter(str(path), {}, 0)
    reads_s = np.array([0.0, 9.0, 18.0, 27.0, 30.0])
    w.add_source(SourceDescriptor("gpu0.energy", "nvml", "g", (Channel("energy_j", "J"),),
                                  config={"uuid": "GPU-a"}))
    w.append("gpu0.energy", (reads_s * 1e9).astype(np.int64), (reads_s * 1e9).astype(np.int64),
             (5000.0 + _true_energy_j(reads_s)).reshape(-1, 1), np.zeros(5, np.uint8))
    t_s = np.arange(0, 1501) * 0.02
    if drop_s is not None:
        t_s = t_s[(t_s < drop_s[0]) | (t_s > drop_s[1])]
    t_ns = np.round(t_s * 1e9).astype(np.int64)
    w.add_source(SourceDescriptor("gpu0.samples", "nvml", "g", (Channel("power_w", "W"),),
                                  config={"uuid": samples_uuid, "sample_period_s": 0.02}))
    w.append("gpu0.samples", t_ns, t_ns, sample_gain(_power_profile_w(t_s)).reshape(-1, 1),
             np.zeros(t_s.size, np.uint8))
    w.close()
    return path


def _window_rows(path, windows, source="gpu0.energy"):
    with wattlab.open(str(path)) as run:
        rep = energy_report(run, by_marker=False, windows=windows)
    return [r for r in rep["rows"] if r["source"] == source and r["phase"].startswith("window")]


def test_counter_edges_between_reads_are_placed_by_the_samples(tmp_path):
    path = _shaped_run(tmp_path)
    (row,) = _window_rows(path, [(3.0, 13.0)])
    truth = _true_energy_j(13.0) - _true_energy_j(3.0)  # 3150 J
    # a line between the reads at 0, 9 and 18 s would say 2550 J; the samples' shape puts
    # the step where it was, and their 4 % excess cancels in the ratio
    assert row["energy_j"] == pytest.approx(truth, rel=2e-3)
    assert row["low_j"] <= truth <= row["high_j"]
    assert row["uncertainty_j"] < 0.1 * truth
    assert any("placed by gpu0.samples:power_w" in n for n in row["notes"])


def test_a_drifting_sample_gain_widens_the_shaped_interval(tmp_path):
    steady = _window_rows(_shaped_run(tmp_path / "a"), [(3.0, 13.0)])[0]
    # samples 10 % high at 400 W only: the shape is wrong, and the run shows it
    drifting = _window_rows(_shaped_run(tmp_path / "b", sample_gain=lambda p: np.where(
        p > 300, 1.10 * p, p)), [(3.0, 13.0)])[0]
    truth = _true_energy_j(13.0) - _true_energy_j(3.0)
    assert drifting["uncertainty_j"] > steady["uncertainty_j"]
    assert drifting["low_j"] <= truth <= drifting["high_j"]
    assert any("drift 2.0 %" in n for n in steady["notes"])
    assert not any("drift 2.0 %" in n for n in drifting["notes"])


@pytest.mark.parametrize("case", ["other GPU", "hole in the samples"])
def test_without_covering_samples_the_counter_is_interpolated_linearly(tmp_path, case):
    kw = {"samples_uuid": "GPU-b"} if case == "other GPU" else {"drop_s": (2.0, 2.5)}
    (row,) = _window_rows(_shaped_run(tmp_path, **kw), [(3.0, 7.0)])
    reads_s = np.array([0.0, 9.0])
    linear = np.diff(np.interp([3.0, 7.0], reads_s, _true_energy_j(reads_s)))[0]
    assert row["energy_j"] == pytest.approx(linear, rel=1e-9)
    assert not any("placed by" in n for n in row["notes"])
    mean = linear / 4.0
    assert row["uncertainty_j"] == pytest.approx(
        mean * (counter_edge_s(reads_s, 3.0) + counter_edge_s(reads_s, 7.0)), rel=1e-9)


def test_cli_energy_window_rows(tmp_path, capsys):
    path = _shaped_run(tmp_path)
    assert main(["energy", str(path), "--window", "3:13", "--window", "20.5:29", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = {r["phase"]: r for r in rep["rows"] if r["source"] == "gpu0.energy"}
    assert rows["window"]["t0_s"] == 3.0 and rows["window#1"]["t1_s"] == 29.0
    assert rows["window#1"]["energy_j"] == pytest.approx(150.0 * 8.5, rel=2e-3)


@pytest.mark.parametrize("text, message", [
    ("5", "is not START:END"), ("a:b", "is not START:END"), ("nan:4", "is not START:END"),
    ("9:3", "end must come after the start"), ("4:4", "end must come after the start")])
def test_cli_energy_window_bad_input_is_a_usage_error(tmp_path, capsys, text, message):
    path = _shaped_run(tmp_path)
    assert main(["energy", str(path), f"--window={text}"]) == 2
    assert message in capsys.readouterr().err


def test_api_window_must_start_before_it_ends(gap_run):
    with wattlab.open(str(gap_run)) as run, pytest.raises(UsageError, match="window 5:2"):
        energy_report(run, windows=[(5.0, 2.0)])


def test_a_window_past_the_end_is_clipped_to_the_run_not_extrapolated(tmp_path):
    path = _shaped_run(tmp_path)  # 30 s
    (row,) = _window_rows(path, [(20.0, 60.0)])
    assert row["t1_s"] == pytest.approx(30.0)
    assert row["energy_j"] == pytest.approx(_true_energy_j(30.0) - _true_energy_j(20.0),
                                            rel=2e-3)
    assert row["valid"] is False and not row["checks"]["window"]["ok"]


def test_a_stream_whose_time_goes_backwards_is_reported_not_a_crash(tmp_path, capsys):
    path = tmp_path / "back.h5"
    w = RunFileWriter(str(path), {}, 0)
    t = np.arange(0, 2001) * MS
    t[1500:] -= 300 * MS
    _add(w, "meter", "meter", t, np.full(t.size, 50.0))
    _add(w, "other", "meter", np.arange(0, 2001) * MS, np.full(2001, 50.0))
    w.close()
    assert main(["energy", str(path), "--json"]) == 0
    rows = {r["source"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["meter"]["energy_j"] is None and not rows["meter"]["checks"]["time"]["ok"]
    # the run is the span both cover: the stepped stream's last row is at 1.7 s
    assert rows["other"]["energy_j"] == pytest.approx(85.0) and rows["other"]["valid"]
