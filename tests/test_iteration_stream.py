"""Online iteration detection: jittered steps on the simulated GPU, bounded memory, each
iteration once, the same answer however the stream is chunked."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from wattlab.analysis.iterations.burst_edges import BinMeans
from wattlab.analysis.iterations.iteration_stream import DetectedIteration, IterationStream
from wattlab.analysis.iterations.power_segments import segment
from wattlab.hardware.training_schedule import TrainingLoop, simulated_training

pytestmark = pytest.mark.fast


def feed(stream: IterationStream, t, p, seconds: float) -> list[DetectedIteration]:
    """Push ``seconds`` of samples at a time, then finish."""
    cuts = np.searchsorted(t, np.arange(t[0], t[-1], round(seconds * 1e9)))[1:]
    out = []
    for tc, pc in zip(np.split(t, cuts), np.split(p, cuts), strict=True):
        out += stream.push(tc, pc)
    return out + stream.finish()


@pytest.fixture(scope="module")
def jittered():
    """60 steps of 0.2 s, waits 0.25 s ± 50 %: spacing 0.33-0.58 s, like a loader-bound job."""
    return simulated_training(TrainingLoop(steps=60, busy_s=0.2, wait_s=0.25, jitter=0.5), 7)


def test_jittered_steps_are_counted_and_costed(jittered):
    t, p, starts, gpu = jittered
    stream = IterationStream()
    found = feed(stream, t, p, 1.0)
    assert stream.steps_seen == starts.size
    assert len(found) == starts.size - 1
    # each start within one sample spacing (+ the samples' ~25 ms lag) of the true start
    found_s = np.array([i.start_ns for i in found]) / 1e9
    assert np.all(np.abs(found_s - starts[:-1] - 0.025) < 0.025)
    true_j = [gpu.true_energy_j(round(a * 1e9), round(b * 1e9))
              for a, b in itertools.pairwise(starts)]
    assert np.mean([i.energy_j for i in found]) == pytest.approx(np.mean(true_j), rel=0.02)
    periods = np.diff(starts)
    assert stream.state.median_period_s == pytest.approx(np.median(periods), rel=0.03)
    q1, q3 = np.percentile(periods, [25, 75])
    assert stream.state.period_iqr_s == pytest.approx(q3 - q1, rel=0.1)
    assert stream.state.count == len(found)
    assert "iterations, period" in str(stream.state)


def test_chunking_does_not_change_the_answer(jittered):
    t, p, _, _ = jittered
    runs = [feed(IterationStream(), t, p, s) for s in (0.1, 1.0, 1e6)]
    assert len({len(r) for r in runs}) == 1
    for a, b in zip(runs[0], runs[2], strict=True):
        assert abs(a.start_ns - b.start_ns) < 2_000_000
        assert a.energy_j == pytest.approx(b.energy_j, rel=0.02)


def test_each_iteration_once_and_contiguous(jittered):
    t, p, _, _ = jittered
    stream = IterationStream()
    cuts = np.arange(50, t.size, 50)
    batches = [stream.push(tc, pc) for tc, pc in zip(np.split(t, cuts), np.split(p, cuts),
                                                       strict=True)]
    found = [i for b in batches for i in b] + stream.finish()
    assert sum(1 for b in batches if b) > 10  # iterations come out while the stream runs
    starts = [i.start_ns for i in found]
    assert starts == sorted(set(starts))
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(found))


def test_memory_is_bounded_on_a_long_stream():
    rate, period = 50.0, 0.4
    stream = IterationStream(memory_s=20.0)
    held, count = [], 0
    for k in range(300):  # 300 s, pushed a second at a time
        t = np.arange(k * 50, (k + 1) * 50) / rate
        p = np.where((t % period) < 0.2, 600.0, 120.0)
        count += len(stream.push(np.round(t * 1e9).astype(np.int64), p))
        held.append(stream.held_samples)
    assert max(held) <= (20.0 + 2.0 + 1.0) * rate
    assert count == pytest.approx(300 / period, abs=8)


def test_steady_power_and_noise_have_no_iterations():
    rng = np.random.default_rng(3)
    t = np.arange(3000) * 20_000_000
    for p in (np.full(3000, 300.0), 300 + rng.normal(0, 30, 3000),
              rng.uniform(100, 600, 3000)):
        stream = IterationStream()
        assert stream.push(t, p) + stream.finish() == []


def test_waking_the_gpu_before_the_first_step_is_no_step():
    """72 W → 120 W seconds before training (a real H100 job does this) is not a burst."""
    rate = 50.0
    t = np.arange(0, 30, 1 / rate)
    p = np.where(t < 5, 72.0, 120.0)
    train = t >= 13
    p[train] = np.where(((t[train] - 13) % 0.5) < 0.2, 650.0, 120.0)
    stream = IterationStream()
    found = feed(stream, np.round(t * 1e9).astype(np.int64), p, 1.0)
    assert stream.steps_seen == 34  # bursts at 13.0, 13.5, ... 29.5
    assert found[0].start_ns / 1e9 == pytest.approx(13.0, abs=0.02)


def test_pauses_and_gaps_are_not_iterations():
    t, p, starts, _ = simulated_training(
        TrainingLoop(steps=40, pause_every=10, pause_s=3.0, jitter=0.3), 11)
    stream = IterationStream(max_period_s=2.0)
    found = feed(stream, t, p, 1.0)
    assert stream.steps_seen == starts.size
    assert stream.skipped == 3  # the pauses after steps 10, 20, 30
    assert max(i.period_s for i in found) < 2.0
    hole = (t > 8e9) & (t < 10e9)  # two seconds lost
    stream = IterationStream()
    found = feed(stream, t[~hole], p[~hole], 1.0)
    assert not any(i.start_ns < 9e9 < i.end_ns for i in found)


def test_bad_input_is_refused():
    stream = IterationStream()
    with pytest.raises(ValueError, match="1-d of one length"):
        stream.push(np.arange(3, dtype=np.int64), np.zeros(4))
    with pytest.raises(ValueError, match="increase"):
        stream.push(np.array([3, 2, 1], dtype=np.int64), np.zeros(3))
    with pytest.raises(ValueError, match="min_period_s"):
        IterationStream(min_period_s=1.0, max_period_s=0.5)


def test_bins_are_the_same_however_the_samples_arrive():
    rng = np.random.default_rng(5)
    t = np.cumsum(rng.integers(400_000, 600_000, 5000)).astype(np.int64)  # ~2 kHz
    p = rng.normal(300, 30, t.size)
    whole = BinMeans(2_500_000)
    t1, p1 = (np.concatenate(x) for x in zip(whole.push(t, p), whole.flush(), strict=True))
    parts = BinMeans(2_500_000)
    pieces = [parts.push(tc, pc) for tc, pc in zip(np.array_split(t, 37),
                                                   np.array_split(p, 37), strict=True)]
    pieces.append(parts.flush())
    assert np.array_equal(t1, np.concatenate([a for a, _ in pieces]))
    assert np.allclose(p1, np.concatenate([b for _, b in pieces]))
    assert t1.size == pytest.approx((t[-1] - t[0]) / 2_500_000, abs=2)


def test_confidence_separates_clean_steps_from_steps_near_the_sample_spacing():
    """40 ms steps parted by 20-60 ms waits: dips of one sample, some missed."""
    clean = segment([simulated_training(TrainingLoop(jitter=0.5), 2)[:2]])
    fast = segment([simulated_training(TrainingLoop(busy_s=0.04, wait_s=0.04), 3)[:2]])
    assert clean.count == 60 and clean.confidence > 0.9
    assert fast.count < 57  # more than 5 % missed: it deserves its lower confidence
    assert fast.confidence < 0.8 and fast.thin_dips > 0.1


def test_no_iteration_spans_a_stretch_without_bursts():
    """Steps, 60 s of steady full load, steps again: once the 20 s of levels hold no step,
    the stream cannot tell what happened, so no iteration bridges it."""
    rate = 50.0
    t = np.arange(0, 150, 1 / rate)
    p = np.where((t % 0.5) < 0.2, 650.0, 120.0)
    p[(t >= 40) & (t < 100)] = 650.0
    stream = IterationStream(max_period_s=100.0, memory_s=20.0)
    found = feed(stream, np.round(t * 1e9).astype(np.int64), p, 1.0)
    assert len(found) > 150 and max(i.period_s for i in found) < 1.0
