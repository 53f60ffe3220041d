import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wattlab.drivers.hmc8015 import parse_log_csv, parse_time_of_day
from wattlab.errors import MeterProtocolError
from wattlab.samples import SampleFlag

pytestmark = pytest.mark.fast


def test_time_of_day() -> None:
    assert parse_time_of_day("00:00:00.000") == 0.0
    assert parse_time_of_day("23:59:59.999") == pytest.approx(86399.999)
    assert parse_time_of_day("7:05:03") == 7 * 3600 + 5 * 60 + 3
    for bad in ("24:00:00.000", "12:60:00", "12:00", "noon", "12:00:00,5"):
        with pytest.raises(ValueError):
            parse_time_of_day(bad)


def test_log_over_midnight_unwraps() -> None:
    csv = b"Time;P[W]\n23:59:59.500;1\n00:00:00.000;2\n00:00:00.500;3\n"
    log = parse_log_csv(csv)
    assert np.diff(log.time_of_day_s).tolist() == [0.5, 0.5]


def test_header_variants_decimal_comma_and_bad_values() -> None:
    csv = (
        b"# HMC8015 log\n# Start: 10:00:00\nTime; URMS (V); Lambda; WH [Wh];\n"
        b"10:00:00.100; 230,5; 0,98; 0,001;\n10:00:00.200;NAN;0.98;9.9E+37\n"
    )
    log = parse_log_csv(csv)
    assert log.functions == ["URMS", "LAMB", "WH"]
    assert [c.name for c in log.channels] == ["voltage_v", "power_factor", "energy_j"]
    assert log.values[0].tolist() == pytest.approx([230.5, 0.98, 3.6])
    assert log.flags.tolist() == [0, SampleFlag.NO_DATA | SampleFlag.OVERRANGE]
    assert log.metadata["Start"] == "10:00:00"


@pytest.mark.parametrize(
    ("csv", "message"),
    [
        (b"Time;P[W]\n12:00:00.000;1;2\n", "line 2: 3 fields"),
        (b"Time;P[W]\nnoon;1\n", "line 2"),
        (b"Time;P[W]\n12:00:00.000;abc\n", "line 2"),
        (b"Time;BOGUS\n", "line 1: header"),
        (b"#only comments\n", "no header"),
        (b"\xff\xfe", "not text"),
    ],
)
def test_malformed_logs_name_the_line(csv: bytes, message: str) -> None:
    with pytest.raises(MeterProtocolError, match=message) as info:
        parse_log_csv(csv, "HMC:X.CSV")
    assert "HMC:X.CSV" in str(info.value)


cells = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from(["NAN", "9.91E+37", "9.9E+37"]),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(cells, min_size=3, max_size=3), min_size=0, max_size=20),
       st.integers(min_value=0, max_value=86399 * 1000))
def test_log_round_trip(rows: list[list[float | str]], start_ms: int) -> None:
    lines = ["#Device;HMC8015", "Time;URMS[V];P[W];WH[Wh]"]
    for n, row in enumerate(rows):
        ms = (start_ms + 100 * n) % 86_400_000
        hh, mm, ss = ms // 3_600_000, ms // 60_000 % 60, ms // 1000 % 60
        stamp = f"{hh:02d}:{mm:02d}:{ss:02d}.{ms % 1000:03d}"
        lines.append(";".join([stamp] + [c if isinstance(c, str) else f"{c:.6E}" for c in row]))
    log = parse_log_csv(("\r\n".join(lines) + "\r\n").encode())
    assert log.values.shape == (len(rows), 3)
    if rows:
        assert np.allclose(np.diff(log.time_of_day_s), 0.1)
    for row, values, flag in zip(rows, log.values, log.flags, strict=True):
        for cell, value, scale in zip(row, values, (1.0, 1.0, 3600.0), strict=True):
            if isinstance(cell, str):
                assert math.isnan(value) and flag != 0
            else:
                assert value == pytest.approx(cell * scale, rel=1e-6, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_log_parser_on_garbage_only_raises_protocol_errors(data: bytes) -> None:
    try:
        log = parse_log_csv(b"Time;P[W]\n" + data)
    except MeterProtocolError:
        return
    assert log.values.shape[1] == 1
