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

pytestmark = pytest.mark.fast

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCPI_TEXT = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="0123456789+-.eE,;:\"' NAnIiFf#\t\r\n", max_size=80),
)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


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
