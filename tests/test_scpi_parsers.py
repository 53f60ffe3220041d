import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wattlab.drivers.scpi import (
    decode_definite_block,
    encode_definite_block,
    parse_error_reply,
    parse_idn,
    parse_number_list,
    split_scpi_list,
)
from wattlab.errors import MeterProtocolError
from wattlab.hardware.emulators.scpi_server import Pattern, parse_command
from wattlab.samples import SampleFlag

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("text", "flag"),
    [
        ("NAN", SampleFlag.NO_DATA),
        ("nan", SampleFlag.NO_DATA),
        ("9.91E+37", SampleFlag.NO_DATA),
        ("99.1E+36", SampleFlag.NO_DATA),
        ("9.9E+37", SampleFlag.OVERRANGE),
        ("-9.9E+37", SampleFlag.OVERRANGE),
        ("99.0E+36", SampleFlag.OVERRANGE),
        ("INF", SampleFlag.OVERRANGE),
    ],
)
def test_bad_value_encodings_become_flagged_nan(text: str, flag: SampleFlag) -> None:
    values, flags = parse_number_list(f"1.0E+00,{text},2.5E-01", "R")
    assert values[0] == 1.0 and values[2] == 0.25
    assert math.isnan(values[1])
    assert flags.tolist() == [0, int(flag), 0]


def test_nr3_values_as_the_analyser_sends_them() -> None:
    values, flags = parse_number_list("104.75E+00,105.02E+00,-0.38E+00", "R")
    assert values.tolist() == [104.75, 105.02, -0.38]
    assert not flags.any()


@pytest.mark.parametrize("reply", ["1.0,abc", "1.0,,2.0", "1.0,1.2.3", "0x10", "1.0E", "--1"])
def test_malformed_numbers_quote_the_reply(reply: str) -> None:
    with pytest.raises(MeterProtocolError) as info:
        parse_number_list(reply, "TCPIP::x::SOCKET")
    assert "TCPIP::x::SOCKET" in str(info.value) and repr(reply) in str(info.value)


def test_wrong_value_count_is_a_protocol_error() -> None:
    with pytest.raises(MeterProtocolError, match="expected 3 values, got 2"):
        parse_number_list("1,2", "R", expected=3)


finite = st.floats(min_value=-1e30, max_value=1e30, allow_nan=False, allow_infinity=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(finite, st.sampled_from(["NAN", "9.91E+37", "9.9E+37"])), min_size=1,
                max_size=12))
def test_nr3_list_round_trip(items: list[float | str]) -> None:
    text = ",".join(x if isinstance(x, str) else f"{x:.6E}" for x in items)
    values, flags = parse_number_list(text, "R", expected=len(items))
    for x, v, f in zip(items, values, flags, strict=True):
        if isinstance(x, str):
            assert math.isnan(v) and f != 0
        else:
            assert f == 0 and v == pytest.approx(x, rel=1e-6, abs=1e-300)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="0123456789+-.eE,NAn ", max_size=30))
def test_nr3_parser_never_returns_a_wrong_number(text: str) -> None:
    try:
        values, flags = parse_number_list(text, "R")
    except MeterProtocolError:
        return
    for field, v, f in zip(text.split(","), values, flags, strict=True):
        if f == 0:
            assert v == float(field)
        else:
            assert math.isnan(v)


def test_error_reply_forms() -> None:
    assert parse_error_reply('813,"Not allowed during integration"') == (
        813, "Not allowed during integration")
    assert parse_error_reply("0") == (0, "")
    assert parse_error_reply('-113,"Undefined header"') == (-113, "Undefined header")
    with pytest.raises(MeterProtocolError):
        parse_error_reply("oops", "R")


def test_idn_and_list_parsing() -> None:
    idn = parse_idn("YOKOGAWA,WT310E,C2XA00001,F1.03")
    assert (idn.manufacturer, idn.model, idn.serial, idn.firmware) == (
        "YOKOGAWA", "WT310E", "C2XA00001", "F1.03")
    with pytest.raises(MeterProtocolError):
        parse_idn("justone", "R")
    assert split_scpi_list('"A.CSV","B,1.CSV"') == ["A.CSV", "B,1.CSV"]
    assert split_scpi_list("") == []


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([b"", b"\n"]))
def test_definite_block_round_trip(payload: bytes, tail: bytes) -> None:
    assert decode_definite_block(encode_definite_block(payload) + tail) == payload


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40))
def test_definite_block_decoder_on_garbage(data: bytes) -> None:
    try:
        payload = decode_definite_block(data, "R", "DATA:DATA?")
    except MeterProtocolError as e:
        assert "R" in str(e)
        return
    assert encode_definite_block(payload) == data.rstrip(b"\r\n")[: len(encode_definite_block(
        payload))]


def test_truncated_block_names_the_byte() -> None:
    with pytest.raises(MeterProtocolError, match="announces 10 bytes, got 3"):
        decode_definite_block(b"#210abc", "R")
    with pytest.raises(MeterProtocolError, match="not a definite-length block"):
        decode_definite_block(b"#0abc", "R")


@pytest.mark.parametrize(
    ("header", "suffixes"),
    [
        (":NUM:NORM:ITEM3 P,1", (3,)),
        (":numeric:normal:item P", (1,)),
        ("NUM:NORM:ITEM10 U", (10,)),
        (":NUMER:NORM:ITEM1 U", None),
        (":NUM:NORM:ITEM1?", None),
    ],
)
def test_emulator_header_matching(header: str, suffixes: tuple[int, ...] | None) -> None:
    assert Pattern(":NUMeric:NORMal:ITEM#").match(parse_command(header)) == suffixes


def test_command_parsing_keeps_quoted_commas() -> None:
    cmd = parse_command('LOG:FNAM "a,b",INT')
    assert cmd.header == "LOG:FNAM" and not cmd.query
    assert cmd.args == ('"a,b"', "INT") and cmd.arg(0) == "a,b"
    assert np.isnan(parse_number_list("NAN")[0][0])
