"""PowerSensor3 frame decoder and device-clock unwrapping (no I/O)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.decoder_corpus import garbage
from tests.decoder_streams import ps3_frame as frame
from tests.decoder_streams import ps3_stream as stream
from wattlab.drivers.powersensor3 import (
    FRAME_BYTES,
    READ_MAX_BYTES,
    DeviceClock,
    FrameDecoder,
    PowerSensor3,
    Scaling,
    SensorConfig,
)

pytestmark = pytest.mark.fast

STOP = b"\xff\x3f\xff\x3f"


def feed_all(dec: FrameDecoder, chunks: list[bytes]) -> tuple[int, int, list]:
    frames = skipped = 0
    outs = []
    for c in chunks:
        out = dec.feed(c)
        frames += out.n
        skipped += out.skipped_bytes
        outs.append(out)
    return frames, skipped, outs


def test_protocols_md_example() -> None:
    levels = [512, 0, 0, 300, 0, 0, 0, 0]
    data = frame(677, levels, marker=True)
    assert data[:4] == bytes.fromhex("fa65 8840") and data[8:10] == bytes.fromhex("b42c")
    out = FrameDecoder().feed(data)
    assert out.n == 1 and out.skipped_bytes == 0
    assert int(out.device_t_us[0]) == 677 and bool(out.marker[0])
    assert out.levels[0].tolist() == levels
    assert out.levels.dtype == np.uint16 and out.device_t_us.dtype == np.uint16


def test_block_decode_matches_frame_by_frame() -> None:
    data = stream(500, seed=3)
    out = FrameDecoder().feed(data)
    assert out.n == 500 and out.skipped_bytes == 0 and not out.resync.any()
    for k in (0, 17, 499):
        assert frame(int(out.device_t_us[k]), out.levels[k].tolist()) == data[18 * k:18 * k + 18]


def test_partial_frames_across_feeds() -> None:
    data = stream(20)
    dec = FrameDecoder()
    cuts = [0, 1, 7, 18, 19, 35, 100, 200, 359, 360]
    frames, skipped, _ = feed_all(dec, [data[a:b] for a, b in itertools.pairwise(cuts)])
    assert (frames, skipped, dec.pending_bytes) == (20, 0, 0)


def test_resync_skips_exactly_the_garbage() -> None:
    garbage = bytes([0x00, 0x12, 0x7F, 0x80, 0xA5, 0xEF, 0x3F])
    data = stream(3) + garbage + stream(4, t0=150)
    out = FrameDecoder().feed(data)
    assert out.n == 7 and out.skipped_bytes == len(garbage)
    assert out.resync.tolist() == [False] * 3 + [True] + [False] * 3
    assert out.skip_events == [(3, len(garbage))]


def test_truncated_frame_is_skipped_whole() -> None:
    data = stream(2) + stream(1, t0=100)[5:] + stream(2, t0=150)
    out = FrameDecoder().feed(data)
    assert out.n == 4 and out.skipped_bytes == 13 and out.resync[2]


def test_resync_flag_carries_over_feeds() -> None:
    dec = FrameDecoder()
    first = dec.feed(stream(1) + b"\x01\x02")
    second = dec.feed(stream(2, t0=50))
    assert first.skipped_bytes == 2 and first.skip_events == [(1, 2)]
    assert second.resync.tolist() == [True, False]


def test_marker_only_on_sensor0_counts() -> None:
    data = bytearray(frame(5, [1] * 8) + frame(55, [1] * 8, marker=True))
    data[5] |= 0x40  # marker bit on sensor 1: ignored
    out = FrameDecoder().feed(bytes(data))
    assert out.marker.tolist() == [False, True]


def test_stops_at_terminator_and_ignores_the_rest() -> None:
    dec = FrameDecoder()
    out = dec.feed(stream(2) + STOP + stream(3))
    assert out.n == 2 and out.stopped and out.skipped_bytes == 0
    assert dec.ignored_bytes == 4 + 54
    assert dec.feed(stream(1)).n == 0
    dec.reset()
    assert dec.feed(stream(1)).n == 1


def test_terminator_is_skipped_while_streaming() -> None:
    dec = FrameDecoder(stop_on_terminator=False)
    out = dec.feed(stream(2) + STOP + stream(3, t0=100))
    assert out.n == 5 and not out.stopped and out.skipped_bytes == 4


def test_terminator_split_across_feeds() -> None:
    dec = FrameDecoder()
    assert not dec.feed(stream(1) + b"\xff").stopped
    assert dec.feed(b"\x3f\xff\x3f").stopped


def test_decoder_is_fast() -> None:
    data = stream(2000) * 10  # 1 s of 20 kHz stream (360 kB)
    dec = FrameDecoder()
    t0 = time.perf_counter()
    n = sum(dec.feed(data[i:i + 36000]).n for i in range(0, len(data), 36000))
    elapsed = time.perf_counter() - t0
    assert n == 20000
    assert elapsed < 0.1  # a small fraction of a core per second of stream


# -- hypothesis ---------------------------------------------------------------------------
def check_invariants(dec: FrameDecoder, chunks: list[bytes]) -> None:
    frames, skipped, outs = feed_all(dec, chunks)
    total = sum(len(c) for c in chunks)
    assert 18 * frames + skipped + dec.pending_bytes + dec.ignored_bytes == total
    for out in outs:
        assert out.levels.shape == (out.n, 8)
        assert int(out.levels.max(initial=0)) <= 1023
        assert int(out.device_t_us.max(initial=0)) <= 1023


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=8), st.booleans())
def test_random_garbage_never_raises(chunks: list[bytes], stop: bool) -> None:
    check_invariants(FrameDecoder(stop_on_terminator=stop), chunks)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 30),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255),
                             st.sampled_from(["replace", "insert", "delete"])), max_size=6),
    cut=st.integers(0, 10_000),
    splits=st.lists(st.integers(0, 10_000), max_size=5),
    stop=st.booleans(),
)
def test_corrupted_valid_streams(n: int, edits: list[tuple[int, int, str]], cut: int,
                                 splits: list[int], stop: bool) -> None:
    data = bytearray(stream(n, seed=n))
    for pos, value, op in edits:
        pos %= len(data) + 1
        if op == "insert":
            data.insert(pos, value)
        elif data and pos < len(data):
            if op == "replace":
                data[pos] = value
            else:
                del data[pos]
    data = data[: cut % (len(data) + 1)] if cut % 3 == 0 else data
    points = sorted({s % (len(data) + 1) for s in splits} | {0, len(data)})
    chunks = [bytes(data[a:b]) for a, b in itertools.pairwise(points)]
    dec = FrameDecoder(stop_on_terminator=stop)
    check_invariants(dec, chunks)
    if not edits and cut % 3:
        assert dec.pending_bytes == 0


# -- device clock -------------------------------------------------------------------------
def test_unwrap_across_wraps_and_reads() -> None:
    clock = DeviceClock()
    true_us = 1_000_000 + np.arange(2000, dtype=np.int64) * 50  # 100 ms at 20 kHz
    raw = (true_us & 0x3FF).astype(np.uint16)
    host0 = 5_000_000_000
    got = []
    for a in range(0, 2000, 250):  # reads every 12.5 ms, read right after the last sample
        b = a + 250
        times = clock.unwrap(raw[a:b], host0 + int(true_us[b - 1] - true_us[0]) * 1000 + 30_000)
        assert not times.estimated.any()
        got.append(times)
    dev = np.concatenate([g.t_device_us for g in got])
    host = np.concatenate([g.t_host_ns for g in got])
    np.testing.assert_array_equal(np.diff(dev), 50)
    assert dev[0] == raw[0]
    assert np.all(np.diff(host) > 0)
    expected = host0 + (true_us - true_us[0]) * 1000
    assert np.abs(host - expected).max() <= 30_000  # within the read latency


def test_lost_stream_is_reanchored_and_flagged() -> None:
    clock = DeviceClock(slack_ns=2_000_000)
    us = np.arange(100, dtype=np.int64) * 50
    clock.unwrap((us & 0x3FF).astype(np.uint16), int(us[-1]) * 1000)
    # 20.3 ms of stream lost: 19 wraps that the 10-bit counter cannot show
    later = us[-1] + 20_300 + np.arange(100, dtype=np.int64) * 50
    times = clock.unwrap((later & 0x3FF).astype(np.uint16), int(later[-1]) * 1000 + 200_000)
    assert times.estimated.all()
    np.testing.assert_array_equal(times.t_device_us, later)
    assert abs(int(times.t_host_ns[-1]) - int(later[-1]) * 1000) < 1_024_000


def test_breaks_locate_the_jump() -> None:
    clock = DeviceClock(slack_ns=2_000_000)
    us = np.arange(100, dtype=np.int64) * 50
    clock.unwrap((us & 0x3FF).astype(np.uint16), int(us[-1]) * 1000)
    nxt = np.concatenate([us[-1] + 50 + np.arange(10) * 50,
                          us[-1] + 10_000 + np.arange(10) * 50])
    times = clock.unwrap((nxt & 0x3FF).astype(np.uint16), int(nxt[-1]) * 1000, breaks=[10])
    assert times.estimated.tolist() == [False] * 10 + [True] * 10
    np.testing.assert_array_equal(times.t_device_us, nxt)


def test_late_read_of_an_unbroken_stream_is_buffered_data_not_lost_wraps() -> None:
    """A busy host reads 60 ms late: the frames waited in a buffer, nothing was lost."""
    clock = DeviceClock()
    us = 1_000_000 + np.arange(3000, dtype=np.int64) * 50
    raw = (us & 0x3FF).astype(np.uint16)
    first = clock.unwrap(raw[:1000], int(us[999] - us[0]) * 1000 + 30_000)
    late = clock.unwrap(raw[1000:2000], int(us[1999] - us[0]) * 1000 + 60_000_000)
    after = clock.unwrap(raw[2000:], int(us[2999] - us[0]) * 1000 + 30_000)
    assert not (late.estimated.any() or after.estimated.any())
    dev = np.concatenate([first.t_device_us, late.t_device_us, after.t_device_us])
    np.testing.assert_array_equal(np.diff(dev), 50)
    host = np.concatenate([first.t_host_ns, late.t_host_ns, after.t_host_ns])
    assert np.all(np.diff(host) > 0)
    # still the envelope: read latency plus the 200 ppm drift it may creep by (~30 µs here)
    assert np.abs(host - (us - us[0]) * 1000).max() <= 60_000


def test_a_dropping_envelope_over_uneven_steps_keeps_times_increasing() -> None:
    """Slewing a lower offset over a batch whose first step is short must not stamp two
    frames alike (seen as equal PowerSensor3 times in a loaded test_faults_disk run)."""
    clock = DeviceClock(slack_ns=2_000_000)
    us = np.arange(100, dtype=np.int64) * 50
    a = clock.unwrap((us & 0x3FF).astype(np.uint16), int(us[-1]) * 1000 + 900_000)  # late read
    later = us[-1] + np.array([10, 1010], dtype=np.int64)  # uneven steps, read at once
    b = clock.unwrap((later & 0x3FF).astype(np.uint16), int(later[-1]) * 1000 + 10_000)
    assert not b.estimated.any()
    host = np.concatenate([a.t_host_ns, b.t_host_ns])
    assert np.all(np.diff(host) > 0)


def test_reanchor_after_a_break_never_steps_back() -> None:
    clock = DeviceClock(slack_ns=2_000_000)
    us = np.arange(200, dtype=np.int64) * 50
    # the first read came late (the envelope is high), the next one shows a loss
    a = clock.unwrap((us[:100] & 0x3FF).astype(np.uint16), int(us[99]) * 1000 + 900_000)
    later = np.concatenate([us[100:150], us[149] + 5_030 + np.arange(50) * 50])
    b = clock.unwrap((later & 0x3FF).astype(np.uint16), int(later[-1]) * 1000 + 10_000)
    host = np.concatenate([a.t_host_ns, b.t_host_ns])
    assert np.all(np.diff(host) > 0)  # two frames are never taken at one instant
    np.testing.assert_array_equal(np.diff(b.t_host_ns[50:]), 50_000)  # the device's own steps
    assert b.estimated.tolist() == [False] * 50 + [True] * 50


@pytest.mark.parametrize("case", ["runf0", "runff", "runf5", "random"])
@pytest.mark.parametrize("stop", [False, True])
def test_faulty_bytes_decode_faster_than_the_device_sends(case: str, stop: bool) -> None:
    """Issue 36 item 7: runs of 0xF0/0xFF went at 116-281 kB/s, under the device's
    360 kB/s (a 1 MB poll took 4-9 s). Bound: the line rate itself, 20 kHz x 18 bytes (a
    loaded CI machine must not fail it); bench/decode.py holds the decoder to 10x."""
    data = {c.name: c.data for c in garbage(READ_MAX_BYTES)}[case]
    t0 = time.process_time()
    FrameDecoder(stop_on_terminator=stop).feed(data)
    assert time.process_time() - t0 < len(data) / (20_000 * FRAME_BYTES)


def formula_values(config: list[SensorConfig], levels: np.ndarray) -> np.ndarray:
    """PROTOCOLS.md's scaling as plain arithmetic: per pair current, voltage, power, then the
    pairs' power summed from +0.0 in order (as numpy's row sum did before issue 39: -0.0 W
    on every pair totals +0.0); float64, stored as float32."""
    pairs = [p for p in range(4) if config[2 * p].in_use and config[2 * p + 1].in_use]
    columns, total = [], np.zeros(levels.shape[0])
    for p in pairs:
        i, v = ((3.3 * levels[:, s] / 1023 - config[s].vref_v) / config[s].sensitivity
                for s in (2 * p, 2 * p + 1))
        columns += [i, v, i * v]
        total = total + i * v
    return np.stack([*columns, total], axis=1).astype(np.float32)


# zero points at the ends of the ADC's range make exact zeros (and -0.0) at level 0 and 1023
vrefs = st.one_of(st.sampled_from([0.0, 3.3]), st.floats(0.0, 3.3))
sensitivities = st.sampled_from([1.0, -1.0]).flatmap(
    lambda sign: st.floats(1e-3, 10.0).map(lambda x: sign * x))
sensors = st.builds(SensorConfig, st.just("MLX10"), st.just("pair"), vrefs, sensitivities,
                    st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(sensors, min_size=8, max_size=8), st.integers(0, 2**32 - 1))
def test_scaling_is_the_formula_bit_for_bit(config: list[SensorConfig], seed: int) -> None:
    """Every level of every sensor, and random rows: the stored float32 bytes are the
    formula's (the look-up table must not move a single value; issue 39)."""
    if not any(config[2 * p].in_use and config[2 * p + 1].in_use for p in range(4)):
        config[0:2] = [SensorConfig("MLX10", "pair", 1.65, 0.12, True),
                       SensorConfig("voltage", "pair", 0.0, 0.091, True)]
    rng = np.random.default_rng(seed)
    levels = np.concatenate([np.repeat(np.arange(1024, dtype=np.uint16)[:, None], 8, axis=1),
                             rng.integers(0, 1024, (500, 8)).astype(np.uint16)])
    got = Scaling(config).convert(levels)
    assert got.dtype == np.float32
    assert got.tobytes() == formula_values(config, levels).tobytes()


class BacklogTransport:
    """A port with a backlog that never ends: every read returns a full tty buffer (4 kB)."""

    def __init__(self) -> None:
        self.data = stream(100_000)
        self.pos = 0

    def read_available(self, max_n: int) -> bytes:
        n = min(max_n, 4096)
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out


def test_a_backlog_is_read_without_pausing() -> None:
    """Reads that come back fuller than the line rate fills a pace mean the host is behind:
    the driver reads on at once (a poll drains its 128 kB, 0.36 s of stream, in
    milliseconds, as it did before it paced its reads; issue 39)."""
    ps = PowerSensor3(BacklogTransport())  # type: ignore[arg-type]
    ps.decoder.stop_on_terminator = False
    t0 = time.perf_counter()
    block = ps.read_stream(min_duration_s=5.0)
    elapsed_s = time.perf_counter() - t0
    assert block.n == READ_MAX_BYTES // FRAME_BYTES
    assert elapsed_s < 0.1  # 32 paced reads would take 0.16 s
