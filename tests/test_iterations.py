"""Iteration period from power: periodic signals found to 1 %, noise gets low confidence."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattlab
from wattlab.analysis.iterations.iteration_stream import DetectedIteration
from wattlab.analysis.iterations.marker_steps import step_marks
from wattlab.analysis.iterations.period_autocorr import detect_period
from wattlab.analysis.iterations.power_segments import merge_inside
from wattlab.analysis.iterations.run_iterations import iterations
from wattlab.cli import main
from wattlab.runfile.reader import MarkerRow
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Marker, SourceDescriptor

pytestmark = pytest.mark.fast


def periodic(period_s=0.37, rate=1000.0, duration=20.0, noise=30.0, seed=1):
    rng = np.random.default_rng(seed)
    t = np.arange(0, duration, 1 / rate)
    phase = (t % period_s) / period_s
    return t, 250 + 300 * (phase < 0.55) + 80 * (phase > 0.8) + rng.normal(0, noise, t.size)


def test_periodic_power_gives_its_period_within_one_percent():
    _, p = periodic()
    r = detect_period(p, 1000.0, 0.05, 2.0)
    assert r.period_s == pytest.approx(0.37, rel=0.01)
    assert r.confidence > 0.7
    assert r.energy_per_iteration_j == pytest.approx(np.mean(p) * 0.37, rel=0.01)
    assert r.iterations == pytest.approx(20 / 0.37, abs=1)


def test_noise_has_low_confidence():
    rng = np.random.default_rng(2)
    r = detect_period(300 + rng.normal(0, 30, 20_000), 1000.0, 0.05, 2.0)
    assert r.confidence < 0.2


def test_too_short_a_stream_is_a_usage_error():
    with pytest.raises(wattlab.errors.UsageError):
        detect_period(np.ones(100), 1000.0, 0.05, 2.0)


def test_iterations_from_a_run_and_the_cli(tmp_path, capsys):
    t, p = periodic(rate=2000.0, duration=10.0)
    path = tmp_path / "it.h5"
    w = RunFileWriter(str(path), {}, 0)
    w.add_source(SourceDescriptor("meter", "meter", "m", (Channel("power_w", "W"),)))
    t_ns = np.round(t * 1e9).astype(np.int64)
    w.append("meter", t_ns, t_ns, p.reshape(-1, 1), np.zeros(t.size, np.uint8))
    w.close()
    with wattlab.open(str(path)) as run:
        r = iterations(run, "meter", min_period_s=0.05, max_period_s=2.0)
    assert r.period_s == pytest.approx(0.37, rel=0.01)
    assert main(["iterations", str(path), "--source", "meter:power_w", "--max-period", "2",
                 "--min-period", "0.05", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["period_s"] == pytest.approx(0.37, rel=0.01)
    assert main(["iterations", str(path), "--source", "meter", "--max-period", "2"]) == 0
    out = capsys.readouterr().out
    assert "27 iterations by power-segments, period 370.0" in out


def test_bursts_inside_marked_evaluations_join_the_step_before():
    found = [DetectedIteration(0, 10, 1.0), DetectedIteration(10, 20, 2.0),
             DetectedIteration(20, 30, 3.0), DetectedIteration(30, 40, 4.0)]
    merged, joined = merge_inside(found, [(15, 25)])
    assert joined == 1
    assert [(i.start_ns, i.end_ns, i.energy_j) for i in merged] == [
        (0, 10, 1.0), (10, 30, 5.0), (30, 40, 4.0)]


def test_thinned_step_markers_count_every_step():
    rows = [MarkerRow(k * 1_000_000_000, "step", "begin", "m", {"step": 10 * k})
            for k in range(5)]
    rows += [MarkerRow(k * 1_000_000_000 + 1, "step", "end", "m", {}) for k in range(5)]
    marks = step_marks(rows)
    assert marks is not None and marks.name == "step"
    assert marks.steps_per_mark == 10 and marks.steps == 50
    assert step_marks(rows[:2]) is None
    with pytest.raises(wattlab.errors.UsageError, match="named 'epoch'"):
        step_marks(rows, "epoch")


def test_markers_in_a_run_count_steps_and_cost_them(tmp_path):
    """A run with ``step`` markers: the markers' count, the samples' energy per step."""
    rate, period = 50.0, 0.4
    t = np.arange(0, 30, 1 / rate)
    p = np.where((t % period) < 0.2, 600.0, 100.0)
    path = tmp_path / "marked.h5"
    w = RunFileWriter(str(path), {}, 0)
    w.add_source(SourceDescriptor("gpu0.samples", "nvml", "sim", (Channel("power_w", "W"),)))
    t_ns = np.round(t * 1e9).astype(np.int64)
    w.append("gpu0.samples", t_ns, t_ns, p.reshape(-1, 1), np.zeros(t.size, np.uint8))
    w.add_markers([Marker(round(k * period * 1e9), "step", "begin", payload={"step": k})
                   for k in range(1, 70)])
    w.close()
    with wattlab.open(str(path)) as run:
        r = iterations(run, "gpu0.samples")
    assert (r.method, r.markers, r.count) == ("markers", "step", 69)
    assert r.period_s == pytest.approx(period)
    assert r.energy_per_iteration_j == pytest.approx(0.2 * 600 + 0.2 * 100, rel=0.01)
