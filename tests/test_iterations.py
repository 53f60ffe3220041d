"""Iteration period from power: periodic signals found to 1 %, noise gets low confidence."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattlab
from wattlab.analysis.iterations import iterations
from wattlab.analysis.period_autocorr import detect_period
from wattlab.cli import main
from wattlab.samples import Channel, SourceDescriptor
from wattlab.sync.run_writer import RunFileWriter


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
    assert "by power-segments, period 369.9" in out
