"""PMD-USB driver: every command's exact bytes, in order (PROTOCOLS.md §3)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from wattlab.drivers.pmd import READ_MAX_BYTES, Command, PmdUsb, crc16_ccitt_false
from wattlab.errors import MeterError, MeterProtocolError, MeterTimeoutError, UsageError
from wattlab.testing import ExpectedProtocol, expected_protocol

pytestmark = pytest.mark.fast

PORT = "/dev/ttyUSB0"
WELCOME = b"ElmorLabs PMD-USB"
STOP = b"\x07\x00\x00\x00"


class BaudProtocol(ExpectedProtocol):
    """ExpectedProtocol that also records baud changes, like SerialTransport.set_baudrate."""

    def __init__(self, exchanges: list[tuple[bytes | None, bytes]]) -> None:
        super().__init__(exchanges)
        self.bauds: list[int] = []

    def set_baudrate(self, baudrate: int) -> None:
        self.bauds.append(baudrate)


def config_struct(v5: bool, offsets: tuple[int, ...] = (3, -4, 0, 1, -1, 2, 0, -128),
                  crc: int | None = None) -> bytes:
    """Config by hand: u8 Version, pad, u16 Crc, int8[8], u8, pad, u16, 7 × u8, [int8[8]], 3."""
    body = bytes(o & 0xFF for o in offsets)
    body += bytes([1, 0]) + (300).to_bytes(2, "little") + bytes([2, 3, 0, 1, 0, 1, 4])
    if v5:
        body += bytes([1, 255, 2, 254, 0, 0, 5, 251])
    body += b"\0\0\0"
    crc = crc16_ccitt_false(body) if crc is None else crc
    return bytes([5 if v5 else 4, 0]) + crc.to_bytes(2, "little") + body


def driver(exchanges: list[tuple[bytes | None, bytes]]) -> tuple[PmdUsb, ExpectedProtocol]:
    proto = BaudProtocol(exchanges)
    return PmdUsb(proto, name=PORT, sleep=lambda s: None), proto


def test_command_table_is_the_documented_bytes() -> None:
    table = {c.name: c.value for c in Command}
    assert table == {
        "WELCOME": b"\x00", "PRODUCT": b"\x01", "SENSORS": b"\x02", "READINGS": b"\x03",
        "CONFIG": b"\x04", "RAW_ADC": b"\x06", "CONTINUOUS": b"\x07", "BAUD": b"\x08",
        "RESET": b"\xf0", "BOOTLOADER": b"\xf1", "NOP": b"\xff",
    }


def test_init_sends_nothing() -> None:
    proto = ExpectedProtocol([])
    PmdUsb(proto)
    assert proto.written == []


def test_crc_is_ccitt_false() -> None:
    assert crc16_ccitt_false(b"123456789") == 0x29B1
    assert crc16_ccitt_false(b"") == 0xFFFF


@pytest.mark.parametrize("trailing", [b"", b"\x00", b"\n"])
def test_identify_with_and_without_trailing_byte(trailing: bytes) -> None:
    with expected_protocol(PmdUsb, [(b"\x00", WELCOME + trailing)]) as pmd:
        assert pmd.identify() == "ElmorLabs PMD-USB"


def test_identify_rejects_other_device() -> None:
    pmd, _ = driver([(b"\x00", b"PowerSensor3 v1.6")])
    with pytest.raises(MeterProtocolError, match=f"{PORT}: not a PMD-USB"):
        pmd.identify()


def test_short_reply_times_out_naming_port_and_command() -> None:
    pmd, _ = driver([(b"\x00", b"Elmor")])
    with pytest.raises(MeterTimeoutError, match=f"{PORT}: no 17-byte reply to command 00"):
        pmd.identify()


def test_product_firmware() -> None:
    with expected_protocol(PmdUsb, [(b"\x01", b"\xee\x0a\x06")]) as pmd:
        info = pmd.read_product()
    assert (info.vendor_id, info.product_id, info.firmware) == (0xEE, 0x0A, 6)
    assert pmd.firmware == 6


def test_product_wrong_ids() -> None:
    pmd, _ = driver([(b"\x01", b"\xee\x15\x02")])
    with pytest.raises(MeterProtocolError, match="product reply ee 15 02"):
        pmd.read_product()


def test_sensor_struct() -> None:
    reply = b""
    for name, v, a, w in [(b"PCIE1", 1200, 90, 108), (b"PCIE2", 1199, 85, 102),
                          (b"EPS1", 1210, 20, 24), (b"EPS2", 0, 0, 0)]:
        reply += name.ljust(6, b"\0") + struct.pack("<HHH", v, a, w)
    assert len(reply) == 48
    pmd, proto = driver([(b"\x02", reply)])
    s = pmd.read_sensors()
    assert [x.name for x in s] == ["PCIE1", "PCIE2", "EPS1", "EPS2"]
    assert (s[0].voltage_v, s[0].current_a, s[0].power_w) == (12.0, 9.0, 108.0)
    assert s[2].voltage_v == pytest.approx(12.1)
    proto.assert_consumed()


def test_polled_readings_example_and_signs() -> None:
    reply = bytes.fromhex("B0045A00") + struct.pack("<6h", 1199, -3, 1210, 25, -5, 0)
    pmd, proto = driver([(b"\x03", reply)])
    r = pmd.read_readings()
    assert (r[0].voltage_v, r[0].current_a) == (12.0, 9.0)
    assert r[0].power_w == pytest.approx(108.0)
    assert r[1].current_a == pytest.approx(-0.3)
    assert r[3].voltage_v == pytest.approx(-0.05)
    proto.assert_consumed()


@pytest.mark.parametrize(("fw", "v5"), [(5, False), (6, True), (7, True)])
def test_config_struct_sizes(fw: int, v5: bool) -> None:
    raw = config_struct(v5)
    assert len(raw) == (34 if v5 else 26)
    pmd, proto = driver([(b"\x04", raw)])
    cfg = pmd.read_config(firmware=fw)
    assert cfg.adc_offset == (3, -4, 0, 1, -1, 2, 0, -128)
    assert (cfg.oled_disable, cfg.timeout_count, cfg.timeout_action, cfg.oled_speed) == (
        1, 300, 2, 3)
    assert (cfg.restart_adc_flag, cfg.cal_flag, cfg.update_config_flag, cfg.oled_rotation,
            cfg.averaging) == (0, 1, 0, 1, 4)
    assert cfg.adc_gain_offset == ((1, -1, 2, -2, 0, 0, 5, -5) if v5 else ())
    assert cfg.version == (5 if v5 else 4)
    assert cfg.to_json()["adc_offset"] == list(cfg.adc_offset)
    proto.assert_consumed()


def test_config_reads_firmware_first_when_unknown() -> None:
    pmd, proto = driver([(b"\x01", b"\xee\x0a\x05"), (b"\x04", config_struct(False))])
    assert pmd.read_config().adc_gain_offset == ()
    proto.assert_consumed()


def test_config_crc_mismatch_names_both_crcs() -> None:
    good = config_struct(True)
    true_crc = int.from_bytes(good[2:4], "little")
    bad = config_struct(True, crc=true_crc ^ 0x0101)
    pmd, _ = driver([(b"\x04", bad)])
    with pytest.raises(MeterProtocolError) as e:
        pmd.read_config(firmware=6)
    msg = str(e.value)
    assert PORT in msg and f"0x{true_crc ^ 0x0101:04X}" in msg and f"0x{true_crc:04X}" in msg


def test_config_crc_covers_every_byte_after_the_crc() -> None:
    raw = bytearray(config_struct(False))
    raw[-1] ^= 0x01  # a reserved byte
    pmd, _ = driver([(b"\x04", bytes(raw))])
    with pytest.raises(MeterProtocolError, match="CRC mismatch"):
        pmd.read_config(firmware=5)


def test_baud_switch_bytes_wait_and_host_rate() -> None:
    proto = BaudProtocol([(bytes.fromhex("0880841E00020000000000000000000000"), b"")])
    slept: list[float] = []
    with expected_protocol(PmdUsb, proto, name=PORT, sleep=slept.append) as pmd:
        pmd.set_baudrate(2_000_000)
    assert slept == [1.0] and proto.bauds == [2_000_000] and pmd.baud == 2_000_000


def test_baud_switch_refuses_bad_rates_and_fixed_transports() -> None:
    pmd, proto = driver([])
    with pytest.raises(UsageError, match="baud 9600"):
        pmd.set_baudrate(9600)
    plain = PmdUsb(ExpectedProtocol([]), name=PORT)
    with pytest.raises(MeterError, match="cannot change its baud rate"):
        plain.set_baudrate(921600)
    assert proto.written == []


def test_continuous_start_stop_and_connect_sequence() -> None:
    pmd, proto = driver([
        (STOP, b""), (b"\x00", WELCOME), (b"\x01", b"\xee\x0a\x06"),
        (b"\x04", config_struct(True)), (b"\x07\x01\x04\xff", b""), (STOP, b""),
        (b"\x07\x01\x02\x33", b""),
    ])
    info = pmd.connect()
    assert info.product.firmware == 6 and info.config.adc_offset[0] == 3
    pmd.start_continuous()
    assert pmd.streaming
    pmd.stop_continuous()
    assert not pmd.streaming
    pmd.start_continuous(mask=0x33, ts_bytes=2)
    proto.assert_consumed()
    assert not any(w[:1] in (b"\xf0", b"\xf1") for w in proto.written)


def test_continuous_stream_through_the_driver_uses_config_offsets() -> None:
    offsets = (3, -4, 0, 1, -1, 2, 0, -128)
    # one frame: ts 1000, V raw 1586-3 so that + offset 3 gives 1586, I raw 184+4
    frame = (1000).to_bytes(4, "little") + struct.pack("<2H", (1583 << 4), (188 << 4))
    pmd, _ = driver([(b"\x04", config_struct(True, offsets)), (b"\x07\x01\x04\x03", b"")])
    pmd.read_config(firmware=6)
    pmd.start_continuous(mask=0x03, ts_bytes=4)
    frames = b"".join((1000 + 5208 * k).to_bytes(4, "little") + frame[4:] for k in range(5))
    block = pmd.decode(frames, host_read_ns=10**12)
    assert block.n == 4  # the last frame waits for its successor
    assert pmd.flush_stream().n == 1
    np.testing.assert_allclose(block.values[0, :3],
                               [1586 * 0.007568, 184 * 0.0488, 1586 * 0.007568 * 184 * 0.0488],
                               rtol=1e-6)
    np.testing.assert_array_equal(np.diff(block.ticks), 5208)
    assert block.t_host_ns[-1] == 10**12
    with pytest.raises(UsageError, match="enables no rail"):
        pmd.start_continuous(mask=0x05)


def test_invalid_stream_settings() -> None:
    pmd, _ = driver([])
    with pytest.raises(UsageError, match="timestamp bytes 3"):
        pmd.start_continuous(mask=0xFF, ts_bytes=3)
    with pytest.raises(MeterError, match="before start_continuous"):
        pmd.read_stream()


class Backlog:
    """A port with more bytes waiting than one poll may take (a stalled host catching up)."""

    port_name = "backlog"

    def __init__(self) -> None:
        self.given = 0

    def write(self, data: bytes) -> None:
        """Commands are not answered."""

    def reset_input(self) -> None:
        """Nothing to drop."""

    def read_available(self, max_n: int) -> bytes:
        self.given += max_n
        return bytes([0x5A, 0xA5, 0x00]) * (max_n // 3) + bytes(max_n % 3)


def test_one_poll_reads_at_most_its_bound() -> None:
    """A poll must stay near its ~0.1 s: it decodes at most READ_MAX_BYTES (1 MB took
    28-39 s on periodic bytes); bench/decode.py times that bound on the worst input."""
    port = Backlog()
    pmd = PmdUsb(port)  # type: ignore[arg-type]
    pmd.start_continuous(0x03, 0)
    pmd.read_stream(min_duration_s=10.0)
    assert port.given == READ_MAX_BYTES <= 1 << 16
