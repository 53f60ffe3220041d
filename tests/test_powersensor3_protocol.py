"""PowerSensor3 driver: every command's exact bytes, in order (PROTOCOLS.md §1)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from wattlab.drivers.powersensor3 import READ_MAX_BYTES, Command, PowerSensor3, SensorConfig
from wattlab.errors import MeterError, MeterProtocolError, MeterTimeoutError
from wattlab.samples import SampleFlag
from wattlab.testing import ExpectedProtocol, expected_protocol

pytestmark = pytest.mark.fast

STOP = b"\xff\x3f\xff\x3f"


def record(kind: str, name: str, vref: float, sens: float, in_use: bool) -> bytes:
    """A configuration record packed by hand: char[16], char[16], float, float, bool."""
    return (kind.encode().ljust(16, b"\0") + name.encode().ljust(16, b"\0")
            + struct.pack("<ff", vref, sens) + bytes([in_use]))


RECORDS = [
    record("MLX10", "slot12", 1.65, 0.120, True), record("volt", "slot12", 0.0, 0.091, True),
    record("MLX10", "slot3v3", 1.65, 0.120, False), record("volt", "slot3v3", 0.0, 0.091, True),
    record("MLX50", "cable1", 1.65, -0.025, True), record("volt", "cable1", 0.0, 0.091, True),
    record("", "", 0.0, 0.0, False), record("", "", 0.0, 0.0, False),
]


def read_config_exchanges() -> list[tuple[bytes | None, bytes]]:
    ex: list[tuple[bytes | None, bytes]] = [(b"R", RECORDS[0])]
    for i in range(1, 8):
        ex.append((b"s", RECORDS[i]))
    ex.append((b"s", b"D"))
    return ex


def connected(extra: list[tuple[bytes | None, bytes]]) -> tuple[PowerSensor3, ExpectedProtocol]:
    proto = ExpectedProtocol(
        [(b"X", STOP), (b"V", b"F411-1.6.1\r\n"), *read_config_exchanges(), *extra]
    )
    ps = PowerSensor3(proto, name="/dev/ttyACM0", drain_timeout_s=0.05)
    ps.connect()
    return ps, proto


def test_command_table_is_the_documented_bytes() -> None:
    table = {c.name: c.value for c in Command}
    assert table["START"] == b"S" and table["STOP"] == b"T" and table["STOP_FLUSH"] == b"X"
    assert table["MARKER"] == b"M" and table["SINGLE_FRAME"] == b"I"
    assert table["COUNTER"] == b"Q" and table["VERSION"] == b"V"
    assert table["READ_CONFIG"] == b"R" and table["WRITE_CONFIG"] == b"W"
    assert all(len(v) == 1 for v in table.values())


def test_init_sends_nothing() -> None:
    proto = ExpectedProtocol([])
    PowerSensor3(proto)
    assert proto.written == []


def test_connect_flushes_reads_version_and_config() -> None:
    ps, proto = connected([])
    proto.assert_consumed()
    assert ps.firmware == "F411-1.6.1"
    c0 = ps.config[0]
    assert (c0.type, c0.pair_name, c0.in_use) == ("MLX10", "slot12", True)
    assert (c0.vref_v, c0.sensitivity) == (pytest.approx(1.65), pytest.approx(0.120))
    assert ps.config[2].in_use is False
    assert ps.scaling is not None and ps.scaling.pairs == [0, 2]  # pair 1 lacks its current
    assert [c.name for c in ps.scaling.channels()] == [
        "current0_a", "voltage0_v", "power0_w", "current2_a", "voltage2_v", "power2_w",
        "power_total_w",
    ]
    assert "sensor 0 (MLX10)" in ps.scaling.channels()[0].meaning


def test_connect_drops_frames_left_streaming_before_the_terminator() -> None:
    frame = bytes.fromhex("fa65 8840 9000 a000 b42c c000 d000 e000 f000")
    proto = ExpectedProtocol([(b"X", frame * 3 + STOP), (b"V", b"F407-1.6.1-DEMO\r\n"),
                              *read_config_exchanges()])
    ps = PowerSensor3(proto, name="p")
    assert ps.connect().firmware == "F407-1.6.1-DEMO"
    proto.assert_consumed()


@pytest.mark.parametrize(("sensor", "field", "value"), [
    (0, "vref_v", float("nan")), (0, "vref_v", float("inf")), (5, "vref_v", -float("inf")),
    (1, "vref_v", 4.0), (0, "sensitivity", 1e-30), (4, "sensitivity", -1e-30),
    (1, "sensitivity", float("nan")), (5, "sensitivity", float("inf")), (0, "sensitivity", 0.0),
    (1, "sensitivity", 1e4),
])
def test_connect_refuses_an_unphysical_configuration_naming_it(
        sensor: int, field: str, value: float) -> None:
    """Issue 36 item 10: NaN/inf vref or a 1e-30 sensitivity gave NaN/inf/1e30 W, unflagged."""
    kind, name, vref, sens, in_use = struct.unpack("<16s16sff?", RECORDS[sensor])
    vref, sens = (value, sens) if field == "vref_v" else (vref, value)
    records = list(RECORDS)
    records[sensor] = kind + name + struct.pack("<ff", vref, sens) + bytes([in_use])
    ex: list[tuple[bytes | None, bytes]] = [(b"R", records[0])]
    ex += [(b"s", r) for r in records[1:]] + [(b"s", b"D")]
    proto = ExpectedProtocol([(b"X", STOP), (b"V", b"F411-1.6.1\r\n"), *ex])
    with pytest.raises(MeterError) as err:
        PowerSensor3(proto, name="/dev/ttyACM0", drain_timeout_s=0.05).connect()
    text = str(err.value)
    shown = repr(float(np.float32(value)))
    assert all(s in text for s in ("/dev/ttyACM0", f"sensor {sensor}", f"pair {sensor // 2}",
                                   field, shown)), text
    assert ("3.3 V" if field == "vref_v" else "0.001") in text, text


def test_an_unused_sensor_may_hold_any_configuration() -> None:
    records = list(RECORDS)
    records[2] = record("MLX10", "slot3v3", float("nan"), 1e-30, False)  # pair 1: not in use
    ex: list[tuple[bytes | None, bytes]] = [(b"R", records[0])]
    ex += [(b"s", r) for r in records[1:]] + [(b"s", b"D")]
    proto = ExpectedProtocol([(b"X", STOP), (b"V", b"F411-1.6.1\r\n"), *ex])
    ps = PowerSensor3(proto, name="p", drain_timeout_s=0.05)
    ps.connect()
    assert ps.scaling is not None and ps.scaling.pairs == [0, 2]


def test_version_garbage_is_a_protocol_error() -> None:
    with (
        expected_protocol(PowerSensor3, [(b"V", b"\x01\x02\n")], name="/dev/x") as ps,
        pytest.raises(MeterProtocolError, match="/dev/x: version reply is not text"),
    ):
        ps.read_version()


@pytest.mark.parametrize("cmd, method", [(b"S", "start"), (b"T", "stop"), (b"M", "mark")])
def test_single_byte_commands(cmd: bytes, method: str) -> None:
    with expected_protocol(PowerSensor3, [(cmd, b"")]) as ps:
        getattr(ps, method)()


def test_counter_is_uint32_le() -> None:
    with expected_protocol(PowerSensor3, [(b"Q", b"\x10\x27\x00\x80")]) as ps:
        assert ps.read_counter() == 0x80002710


def test_counter_short_reply_times_out() -> None:
    proto = ExpectedProtocol([(b"Q", b"\x10\x27")])
    with pytest.raises(MeterTimeoutError):
        PowerSensor3(proto).read_counter()


def test_single_frame() -> None:
    frame = bytes.fromhex("fa65 8840 9000 a000 b42c c000 d000 e000 f000")
    with expected_protocol(PowerSensor3, [(b"I", frame)]) as ps:
        f = ps.read_single_frame()
    assert f.n == 1 and int(f.device_t_us[0]) == 677 and bool(f.marker[0])
    assert f.levels[0].tolist() == [512, 0, 0, 300, 0, 0, 0, 0]


def test_single_frame_garbage_is_a_protocol_error() -> None:
    proto = ExpectedProtocol([(b"I", bytes(18))])
    with pytest.raises(MeterProtocolError, match="not a frame"):
        PowerSensor3(proto, name="ps").read_single_frame()


def test_read_config_acks_each_record_then_expects_d() -> None:
    proto = ExpectedProtocol(read_config_exchanges())
    cfg = PowerSensor3(proto).read_config()
    proto.assert_consumed()
    assert proto.written == [b"R"] + [b"s"] * 8
    assert cfg[4].sensitivity == pytest.approx(-0.025)
    assert [c.pack() for c in cfg] == RECORDS


def test_read_config_without_d_is_a_protocol_error() -> None:
    ex = read_config_exchanges()
    ex[-1] = (b"s", b"?")
    with pytest.raises(MeterProtocolError, match=r"ps: expected b'D'"):
        PowerSensor3(ExpectedProtocol(ex), name="ps").read_config()


def test_write_config_sends_records_and_reads_s_then_d() -> None:
    cfg = [SensorConfig.unpack(r) for r in RECORDS]
    ex: list[tuple[bytes | None, bytes]] = [(b"W", b"")]
    ex += [(r, b"S") for r in RECORDS[:-1]]
    ex.append((RECORDS[-1], b"SD"))
    proto = ExpectedProtocol(ex)
    PowerSensor3(proto).write_config(cfg)
    proto.assert_consumed()
    assert b"".join(proto.written) == b"W" + b"".join(RECORDS)


def test_write_config_refused_record() -> None:
    cfg = [SensorConfig.unpack(r) for r in RECORDS]
    proto = ExpectedProtocol([(b"W", b""), (RECORDS[0], b"E")])
    with pytest.raises(MeterProtocolError, match="record 0"):
        PowerSensor3(proto, name="ps").write_config(cfg)


def test_stop_and_flush_keeps_frames_and_markers_before_the_terminator() -> None:
    marked = bytes.fromhex("fa65 8840 9000 a000 b42c c000 d000 e000 f000")
    plain = bytes.fromhex("fa79 8800 9000 a000 b42c c000 d000 e000 f000")  # t = 697
    ps, proto = connected([(b"X", plain + marked + STOP)])
    block = ps.stop_and_flush()
    proto.assert_consumed()
    assert block.n == 2 and block.stopped
    assert block.marker_index.tolist() == [1]
    assert block.flags[1] & SampleFlag.MARKER
    assert (block.t_device_us[1] - block.t_device_us[0]) % 1024 == (677 - 697) % 1024


def test_stop_and_flush_without_terminator_times_out_naming_port() -> None:
    ps, _ = connected([(b"X", b"")])
    with pytest.raises(MeterTimeoutError, match="/dev/ttyACM0: no stop terminator"):
        ps.stop_and_flush(timeout_s=0.02)


def test_stream_converts_levels_to_si() -> None:
    # sensor 0 level 512 -> (3.3*512/1023 - 1.65)/0.12 A; sensor 1 level 300 -> V.
    frame = bytes.fromhex("fa65 8800 942c a000 b000 c000 d42c e000 f000")
    ps, proto = connected([(b"S", frame)])
    ps.start()
    block = ps.read_stream()
    proto.assert_consumed()
    i0 = (3.3 * 512 / 1023 - 1.65) / 0.120
    v = 3.3 * 300 / 1023 / 0.091
    i2 = (3.3 * 0 / 1023 - 1.65) / -0.025  # inverted polarity: positive current
    assert block.values.dtype == np.float32
    np.testing.assert_allclose(block.values[0], [i0, v, i0 * v, i2, v, i2 * v,
                                                 i0 * v + i2 * v], rtol=1e-5, atol=1e-5)


def test_config_without_active_pair_is_an_error() -> None:
    ex: list[tuple[bytes | None, bytes]] = [(b"R", record("", "", 0, 0, False))]
    ex += [(b"s", record("", "", 0, 0, False)) for _ in range(7)]
    ex.append((b"s", b"D"))
    ps = PowerSensor3(ExpectedProtocol([(b"X", STOP), (b"V", b"F411-1.6.1\r\n"), *ex]),
                      name="ps")
    with pytest.raises(MeterError, match="ps: no sensor pair"):
        ps.connect()


class Backlog:
    """A port with more bytes waiting than one poll may take (a stalled host catching up)."""

    port_name = "backlog"

    def __init__(self) -> None:
        self.given = 0

    def write(self, data: bytes) -> None:
        """Commands are not answered."""

    def read_available(self, max_n: int) -> bytes:
        self.given += max_n
        return b"\xf0" * max_n  # what made a poll block for seconds (issue 36 item 7)


def test_one_poll_reads_at_most_its_bound() -> None:
    """A poll must stay near its ~0.1 s: it decodes at most READ_MAX_BYTES (1 MB took
    seconds on faulty bytes); bench/decode.py times that bound on the worst input."""
    port = Backlog()
    PowerSensor3(port).read_stream(min_duration_s=10.0)  # type: ignore[arg-type]
    assert port.given == READ_MAX_BYTES <= 1 << 17
