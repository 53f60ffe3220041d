"""MCP39F511N driver and source: every frame's exact bytes, every reply checked (PROTOCOLS §6)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.acquirers.mcp39f511_acquirer import Mcp39f511Acquirer, stream_channels
from wattlab.drivers.mcp39f511 import Mcp39f511, read_frame, write_frame
from wattlab.errors import MeterProtocolError, MeterTimeoutError, UsageError
from wattlab.testing import ExpectedProtocol, expected_protocol

pytestmark = pytest.mark.fast

PORT = "/dev/ttyACM0"
READ_ACTIVE_POWER = bytes.fromhex("A5 08 41 00 16 4E 08 5A")  # PROTOCOLS.md §6, by hand
ACTIVE_POWER_REPLY = bytes.fromhex("06 0B C0 5D 00 00 D2 04 00 00 04")  # 240.00 W, 12.34 W


def cs(data: bytes) -> bytes:
    return bytes([sum(data) & 0xFF])


def reply(data: bytes) -> bytes:
    """ACK, length, data, checksum over all three."""
    head = bytes([0x06, len(data) + 3]) + data
    return head + cs(head)


def request(address: int, n: int) -> bytes:
    body = bytes([0xA5, 8, 0x41, address >> 8, address & 0xFF, 0x4E, n])
    return body + cs(body)


def write_request(address: int, data: bytes) -> bytes:
    body = bytes([0xA5, 8 + len(data), 0x41, address >> 8, address & 0xFF, 0x4D, len(data)])
    return body + data + cs(body + data)


def chip(exchanges: list[tuple[bytes | None, bytes]]) -> tuple[Mcp39f511, ExpectedProtocol]:
    proto = ExpectedProtocol(exchanges)
    return Mcp39f511(proto, name=PORT), proto


def test_frames_are_the_documented_bytes() -> None:
    assert read_frame(0x0016, 8) == READ_ACTIVE_POWER
    assert write_frame(0x00A8, b"\x01\x00") == bytes.fromhex("A5 0A 41 00 A8 4D 02 01 00 E8")
    with pytest.raises(UsageError, match="1-32 bytes"):
        read_frame(0x0002, 33)


def test_active_power_of_both_channels() -> None:
    with expected_protocol(Mcp39f511, [(READ_ACTIVE_POWER, ACTIVE_POWER_REPLY)]) as drv:
        assert struct.unpack("<II", drv.read(0x0016, 8)) == (24000, 1234)  # 10 mW units


def test_save_to_flash_and_eeprom_pages() -> None:
    page = bytes(range(16))
    drv, proto = chip([
        (bytes.fromhex("A5 04 53 FC"), b"\x06"),
        (bytes.fromhex("A5 05 42 03 EF"), reply(page)),
        (bytes([0xA5, 0x15, 0x50, 0x03]) + page + cs(bytes([0xA5, 0x15, 0x50, 0x03]) + page),
         b"\x06"),
    ])
    drv.save_to_flash()
    assert drv.read_eeprom_page(3) == page
    drv.write_eeprom_page(3, page)
    proto.assert_consumed()
    with pytest.raises(UsageError, match="EEPROM page 32"):
        drv.read_eeprom_page(32)


def outputs_bytes(status: int = 0xF0, p1: int = 24000, p2: int = 1234) -> bytes:
    """status, version, 230.0 V, 50.000 Hz, PF 0.5 / -0.25, 1.2345 A / 0.0567 A, P1, P2."""
    return struct.pack("<HHHHhhIIII", status, 0x5A15, 2300, 50000, 16384, -8192, 12345, 567,
                       p1, p2)


def test_outputs_decode_units_and_signs() -> None:
    drv, proto = chip([(request(0x0002, 28), reply(outputs_bytes())),
                       (request(0x0002, 28), reply(outputs_bytes(status=0xA0)))])
    o = drv.read_outputs()
    assert (o.voltage_v, o.frequency_hz) == pytest.approx((230.0, 50.0))
    assert o.power_factor == pytest.approx((0.5, -0.25))
    assert o.current_a == pytest.approx((1.2345, 0.0567))
    assert o.active_w == pytest.approx((240.0, 12.34))
    negative = drv.read_outputs()  # bits 4 and 6 clear: both active powers negative
    assert negative.active_w == pytest.approx((-240.0, -12.34))
    proto.assert_consumed()


@pytest.mark.parametrize(("answer", "error", "message"), [
    (b"\x15", MeterProtocolError, "NAK to frame a5 08 41 00 16"),
    (b"\x51", MeterProtocolError, "checksum of frame"),
    (b"\x07", MeterProtocolError, "0x07, expected ACK"),
    (ACTIVE_POWER_REPLY[:-1] + b"\x05", MeterProtocolError, r"checksum 0x05 at offset 10"),
    (b"\x06\x0c" + ACTIVE_POWER_REPLY[2:], MeterProtocolError, "length byte 12"),
    (ACTIVE_POWER_REPLY[:5], MeterTimeoutError, "cut short"),
    (b"", MeterTimeoutError, "no answer"),
])
def test_bad_answers_are_named(answer: bytes, error: type[Exception], message: str) -> None:
    drv, _ = chip([(READ_ACTIVE_POWER, answer)])
    with pytest.raises(error, match=message) as info:
        drv.read(0x0016, 8)
    assert PORT in str(info.value)


def powers_bytes(import1: int, import2: int) -> bytes:
    """Q1, Q2 (10 mW), S1, S2, import-active accumulators 1 and 2."""
    return struct.pack("<IIIIQQ", 5000, 100, 25000, 1300, import1, import2)


OPEN = [
    (request(0x0004, 2), reply(b"\x15\x5a")),
    (request(0x00A8, 2), reply(b"\x04\x00")),  # factory N = 4 ...
    (request(0x00A0, 4), reply(b"\x00\x00\x00\x01")),  # ... and no accumulation
    (write_request(0x00A8, b"\x01\x00"), b"\x06"),
    (write_request(0x00A0, b"\x00\x03\x00\x01"), b"\x06"),
    (request(0x0002, 28), reply(outputs_bytes())),
    (request(0x001E, 32), reply(powers_bytes(1000, 10))),
    (request(0x003E, 16), reply(struct.pack("<QQ", 0, 0))),
]
CLOSE = [(write_request(0x00A8, b"\x04\x00"), b"\x06"),
         (write_request(0x00A0, b"\x00\x00\x00\x01"), b"\x06")]


def test_source_sets_n_and_accumulation_reads_each_update_once_and_restores() -> None:
    update = [
        (request(0x0002, 28), reply(outputs_bytes())),  # unchanged: the same update
        (request(0x0002, 28), b"\x15"),  # NAK: tried again
        (request(0x0002, 28), reply(outputs_bytes(p1=24100))),
        (request(0x001E, 32), reply(powers_bytes(1003, 10))),
        (request(0x003E, 16), reply(struct.pack("<QQ", 0, 2))),
    ]
    proto = ExpectedProtocol(OPEN + update + CLOSE)
    acq = Mcp39f511Acquirer(PORT, "mcp", transport_factory=lambda port: proto)
    (desc,) = acq.open()
    assert desc.firmware == "0x5A15"
    assert desc.config["update_interval_s"] == pytest.approx(0.04)
    assert desc.channel_names == [c.name for c in stream_channels()]
    assert acq.poll() == []
    readings = []
    while not readings:
        readings = acq.poll()
    (chunk,) = readings
    assert isinstance(chunk, Chunk)
    row = dict(zip(desc.channel_names, chunk.values[0], strict=True))
    assert row["power1_w"] == pytest.approx(241.0)
    assert row["reactive1_var"] == pytest.approx(50.0)
    assert row["apparent2_va"] == pytest.approx(13.0)
    assert row["energy_import1_j"] == pytest.approx(3 * 3.6)  # counts since open × unit
    assert row["energy_export2_j"] == pytest.approx(2 * 3.6)
    assert row["power_total_w"] == pytest.approx(241.0 + 12.34)
    assert acq.retries == 1
    acq.close()
    proto.assert_consumed()
    assert proto.closed


def test_a_board_already_set_up_is_left_as_it_was() -> None:
    opened = [OPEN[0], (request(0x00A8, 2), reply(b"\x01\x00")),
              (request(0x00A0, 4), reply(b"\x00\x03\x00\x00")), *OPEN[5:]]
    proto = ExpectedProtocol(opened)
    acq = Mcp39f511Acquirer(PORT, transport_factory=lambda port: proto)
    acq.open()
    acq.close()
    proto.assert_consumed()


def test_unread_updates_become_a_gap_counted_in_updates() -> None:
    proto = ExpectedProtocol(OPEN)
    acq = Mcp39f511Acquirer(PORT, transport_factory=lambda port: proto)
    acq.open()
    acq._last_ns = 0
    (gap,) = acq._missed(int(0.2e9))
    assert gap.samples_lost == 4 and acq.updates_lost == 4
    assert acq._missed(int(0.24e9)) == []
    assert np.isfinite(acq.interval_s)


def test_bad_options_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="accumulation_n 9"):
        Mcp39f511Acquirer(PORT, accumulation_n=9)
    with pytest.raises(UsageError, match="energy_unit_j"):
        Mcp39f511Acquirer(PORT, energy_unit_j=0)
