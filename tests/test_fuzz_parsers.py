"""Bad input to every decoder and parser: only the documented errors, never a crash.

Extends the per-driver hypothesis tests with two properties they lack: decoding is the
same whatever way the bytes are split into reads (random bytes, not only valid streams),
and whole SCPI instrument drivers given arbitrary replies raise ``MeterError`` or return
well-formed arrays, nothing else.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.decoder_streams import damage, pmd_stream, ps3_frame, ps3_stream
from wattlab.drivers.hmc8015 import Hmc8015, parse_log_csv
from wattlab.drivers.pmd import ContinuousDecoder
from wattlab.drivers.powersensor3 import FrameDecoder
from wattlab.drivers.scpi import (
    decode_definite_block,
    parse_error_reply,
    parse_idn,
    parse_number_list,
    split_scpi_list,
)
from wattlab.drivers.yokogawa_wt300e import Wt300e
from wattlab.errors import MeterError, MeterProtocolError

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCPI_TEXT = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="0123456789+-.eE,;:\"' NAnIiFf#\t\r\n", max_size=80),
)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.fast
@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=6), st.booleans())
def test_powersensor3_decoding_does_not_depend_on_read_boundaries(
        data: bytes, cuts: list[int], stop: bool) -> None:
    whole = FrameDecoder(stop_on_terminator=stop).feed(data)
    split_dec = FrameDecoder(stop_on_terminator=stop)
    outs = [split_dec.feed(p) for p in pieces(data, cuts)]
    assert sum(o.n for o in outs) == whole.n
    levels = np.concatenate([o.levels for o in outs]) if outs else whole.levels[:0]
    np.testing.assert_array_equal(levels.reshape(whole.levels.shape), whole.levels)
    np.testing.assert_array_equal(np.concatenate([o.device_t_us for o in outs] or
                                                 [whole.device_t_us[:0]]), whole.device_t_us)
    assert sum(o.skipped_bytes for o in outs) == whole.skipped_bytes


@pytest.mark.fast
@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=6),
       st.integers(1, 255), st.sampled_from([0, 1, 2, 4]))
def test_pmd_decoding_does_not_depend_on_read_boundaries(
        data: bytes, cuts: list[int], mask: int, ts_bytes: int) -> None:
    one = ContinuousDecoder(mask, ts_bytes)
    whole = [one.feed(data), one.flush()]
    split_dec = ContinuousDecoder(mask, ts_bytes)
    outs = [split_dec.feed(p) for p in pieces(data, cuts)] + [split_dec.flush()]
    np.testing.assert_array_equal(np.concatenate([o.words for o in outs]),
                                  np.concatenate([o.words for o in whole]))
    np.testing.assert_array_equal(np.concatenate([o.values for o in outs]),
                                  np.concatenate([o.values for o in whole]))
    assert sum(o.skipped_bytes for o in outs) == sum(o.skipped_bytes for o in whole)


@pytest.mark.fast
@FUZZ
@given(SCPI_TEXT, st.integers(1, 8))
def test_scpi_text_parsers_raise_only_meter_errors(reply: str, expected: int) -> None:
    for parse in (lambda: parse_error_reply(reply, "fuzz"), lambda: parse_idn(reply, "fuzz"),
                  lambda: split_scpi_list(reply)):
        try:
            parse()
        except MeterError as e:
            assert "fuzz" in str(e) or str(e)
    try:
        values, flags = parse_number_list(reply, "fuzz", expected=expected)
    except MeterProtocolError as e:
        assert "fuzz" in str(e)
    else:
        assert values.shape == flags.shape == (expected,)


@pytest.mark.fast
@FUZZ
@given(st.binary(max_size=120))
def test_definite_block_raises_only_protocol_errors(data: bytes) -> None:
    try:
        payload = decode_definite_block(data, "fuzz", "CMD?")
    except MeterProtocolError as e:
        assert "fuzz" in str(e)
    else:
        assert len(payload) <= len(data)


class ReplyTransport:
    """A TextTransport that answers every query with the next fuzzed reply."""

    resource_name = "fuzz::INSTR"

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)

    def write(self, cmd: str) -> None:
        """Commands are accepted; only replies are fuzzed."""

    def query(self, cmd: str) -> str:
        return self.replies.pop(0) if self.replies else "0,\"No error\""

    def query_binary_block(self, cmd: str) -> bytes:
        return self.query(cmd).encode()

    def close(self) -> None:
        """Nothing to release."""


@pytest.mark.fast
@FUZZ
@given(st.lists(SCPI_TEXT, min_size=1, max_size=4))
@example(["", "²"])  # str.isdigit() says yes, int() says no: found in CI
def test_wt300e_driver_on_garbage_replies(replies: list[str]) -> None:
    driver = Wt300e(ReplyTransport(replies), "WT310E")
    driver.items = [("P", 1), ("U", 1)]
    for call in (driver.read_values, driver.wait_update):
        try:
            out = call()
        except MeterError as e:
            assert "fuzz::INSTR" in str(e)
        else:
            if isinstance(out, tuple):
                assert out[0].shape == (2,) and out[1].dtype == np.uint8


@pytest.mark.fast
@FUZZ
@given(st.lists(SCPI_TEXT, min_size=1, max_size=4))
def test_hmc8015_driver_on_garbage_replies(replies: list[str]) -> None:
    driver = Hmc8015(ReplyTransport(replies))
    driver.functions = ["P", "URMS", "IRMS"]
    try:
        driver.connect()
    except MeterError as e:
        assert "fuzz::INSTR" in str(e)
    try:
        values, flags = driver.read_values()
    except MeterError as e:
        assert "fuzz::INSTR" in str(e)
    else:
        assert values.shape == flags.shape == (3,)


@pytest.mark.fast
@FUZZ
@given(st.one_of(st.binary(max_size=300),
                 st.text(alphabet="#;:0123456789.,PURMSIW \n\r-eE", max_size=300)
                 .map(str.encode)))
def test_hmc8015_log_parser_raises_only_protocol_errors(data: bytes) -> None:
    try:
        log = parse_log_csv(data, "fuzz.csv")
    except MeterProtocolError as e:
        assert "fuzz.csv" in str(e)
    else:
        assert log is not None


# -- CI-sized decoder fuzz (issue 36 item 7) ---------------------------------------------
# A few thousand inputs a decoder, as a faulty device sends them: random bytes, periodic
# patterns, runs of one byte, a damaged valid stream between two of those; read in random
# pieces. Under the "ci" profile (tests/conftest.py) the same inputs every run. Tier
# `system` (tests/tiers.py: a pure test over a second): 2-10 s a case on a quiet machine,
# 20-45 s in all, which is most of the fast tier's minute; under load a failing case
# shrinks for minutes (115 s for one). Same examples, in the tier whose budget holds them.
CI_FUZZ = settings(max_examples=500, deadline=None,  # x4 timestamp widths: 2,000 for PMD
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CI_FUZZ_PS3 = settings(CI_FUZZ, max_examples=1000)  # x2 terminator modes
FAULTY = st.one_of(
    st.binary(max_size=300),
    st.tuples(st.binary(min_size=1, max_size=64), st.integers(0, 300)).map(
        lambda pn: (pn[0] * (pn[1] // len(pn[0]) + 1))[:pn[1]]),
    st.tuples(st.integers(0, 255), st.integers(0, 300)).map(lambda vn: bytes([vn[0]]) * vn[1]),
)
DAMAGE = st.lists(st.tuples(st.integers(0, 2000), st.sampled_from(["drop", "insert"]),
                            st.integers(1, 40)), max_size=3)


def around(before: bytes, stream: bytes, edits: list[tuple[int, str, int]], after: bytes,
           seed: int) -> bytes:
    edits = [(p % (len(stream) + 1), kind, k) for p, kind, k in edits]
    return before + damage(stream, edits, seed) + after


@pytest.mark.system
@pytest.mark.parametrize("ts_bytes", [0, 1, 2, 4])
@CI_FUZZ
@given(before=FAULTY, frames=st.integers(0, 40), edits=DAMAGE, after=FAULTY,
       mask=st.integers(1, 255), cuts=st.lists(st.integers(0, 3000), max_size=5))
# CI found it: a run of 4 spurious frames cut after its 4th learnt no period, the same run
# read whole learnt one from its 5th frame, so the next lock was found in one and not the
# other (the period is now learnt from the whole run, across reads)
@example(before=b"", frames=40, edits=[(42, "insert", 5), (343, "insert", 25)], after=b"",
         mask=11, cuts=[61])
def test_pmd_decoder_on_faulty_device_bytes(ts_bytes: int, before: bytes, frames: int,
                                            edits: list[tuple[int, str, int]], after: bytes,
                                            mask: int, cuts: list[int]) -> None:
    nch = bin(mask).count("1")
    data = around(before, pmd_stream(frames, ts_bytes, seed=frames, nch=nch)[0], edits,
                  after, frames)
    learning = ContinuousDecoder(mask, ts_bytes)
    outs = [learning.feed(data), learning.flush()]
    assert learning.frame_bytes * sum(o.n for o in outs) + sum(
        o.skipped_bytes for o in outs) + learning.pending_bytes == len(data)
    assert all(np.isfinite(o.values).all() for o in outs)
    # Read boundaries do not matter with the nibble rule given: learnt, it is learnt per
    # run and runs end at reads, so a read boundary can change it (as before issue 36's
    # rewrite: the reference decoder does the same)
    whole = ContinuousDecoder(mask, ts_bytes, low_nibble_zero=False)
    one = [whole.feed(data), whole.flush()]
    split = ContinuousDecoder(mask, ts_bytes, low_nibble_zero=False)
    parts = [split.feed(p) for p in pieces(data, cuts)] + [split.flush()]
    np.testing.assert_array_equal(np.concatenate([o.words for o in parts]),
                                  np.concatenate([o.words for o in one]))
    assert sum(o.skipped_bytes for o in parts) == sum(o.skipped_bytes for o in one)


@pytest.mark.system
@pytest.mark.parametrize("stop", [False, True])
@CI_FUZZ_PS3
@given(before=FAULTY, frames=st.integers(0, 40), edits=DAMAGE, after=FAULTY,
       cuts=st.lists(st.integers(0, 3000), max_size=5))
def test_powersensor3_decoder_on_faulty_device_bytes(stop: bool, before: bytes, frames: int,
                                                     edits: list[tuple[int, str, int]],
                                                     after: bytes, cuts: list[int]) -> None:
    data = around(before, ps3_stream(frames, seed=frames), edits, after, frames)
    whole = FrameDecoder(stop_on_terminator=stop)
    one = whole.feed(data)
    split = FrameDecoder(stop_on_terminator=stop)
    parts = [split.feed(p) for p in pieces(data, cuts)]
    assert 18 * one.n + one.skipped_bytes + whole.pending_bytes + whole.ignored_bytes == len(data)
    np.testing.assert_array_equal(np.concatenate([o.levels for o in parts] or [one.levels[:0]]),
                                  one.levels)
    assert sum(o.skipped_bytes for o in parts) == one.skipped_bytes
    # a frame passed on has every fixed bit of the format: its bytes are in the input
    for t, levels, marker in zip(one.device_t_us[:5], one.levels[:5], one.marker[:5],
                                 strict=True):
        assert ps3_frame(int(t), levels.tolist(), bool(marker))[:3] in data
