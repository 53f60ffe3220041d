"""Microchip MCP39F511N dual-channel power monitor (the ADM00706 demo board) over UART.

Frames host → chip: ``A5 <len> <command bytes…> <checksum>``, ``len`` counting every byte
of the frame and the checksum being the sum of all bytes before it, mod 256. A frame may
chain commands; wattlab sends "set address pointer" (``41 hi lo``) then one register
command. The chip answers ``06`` (ACK) — for a read followed by ``<len> <data…> <cs>``, the
checksum summing ``06``, ``len`` and the data — or ``15`` (NAK) or ``51`` (checksum fail).

Register map (dual-channel part; byte addresses, little-endian): 0x0002 system status
(b16), 0x0004 system version (u16, date code), 0x0006 voltage RMS (u16), 0x0008 line
frequency (u16), 0x000A/0x000C power factor 1/2 (s16), 0x000E/0x0012 current RMS 1/2
(u32), 0x0016/0x001A active power 1/2 (u32), 0x001E/0x0022 reactive power 1/2 (u32),
0x0026/0x002A apparent power 1/2 (u32), then u64 accumulators: import active 1/2 at
0x002E/0x0036, export active 0x003E/0x0046, import reactive 0x004E/0x0056, export reactive
0x005E/0x0066; 0x00A0 system configuration (b32), 0x00A8 accumulation interval (u16, N:
outputs update every 2^N line cycles).

Tolerant, or assumed, where no second source confirmed it (all **[unverified]**):

* Scaling of the demo board's calibration: voltage 0.1 V, current 0.1 mA, power 10 mW
  (the 10 mW is confirmed by two sources), frequency 1 mHz, power factor s16 / 32768.
* Signs: system status bits 4/5 (channel 1 active/reactive) and 6/7 (channel 2) are set
  when the power is positive; the power registers hold magnitudes.
* Energy accumulation is switched on by system configuration bits 8 (channel 1) and 9
  (channel 2). One accumulator count is ``energy_unit_j`` (default 1 mWh = 3.6 J): no
  source states the unit, so the source checks it against the integrated power.
* A register read returns at most 32 bytes.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from wattlab.drivers.transport import ByteTransport
from wattlab.errors import MeterError, MeterProtocolError, MeterTimeoutError, UsageError

HEADER = 0xA5
MAX_READ_BYTES = 32
EEPROM_PAGE_BYTES = 16
EEPROM_PAGES = 32


class Command(enum.IntEnum):
    """Command bytes inside a frame."""

    SET_POINTER = 0x41  # + address hi, lo
    READ = 0x4E  # + n: register read, n bytes
    WRITE = 0x4D  # + n + data: register write, n bytes
    SAVE_TO_FLASH = 0x53
    READ_EEPROM_PAGE = 0x42  # + page
    WRITE_EEPROM_PAGE = 0x50  # + page + 16 bytes


class Reply(enum.IntEnum):
    """First byte of every answer."""

    ACK = 0x06
    NAK = 0x15
    CSFAIL = 0x51


class Register(enum.IntEnum):
    """Byte addresses of the registers wattlab uses."""

    SYSTEM_STATUS = 0x0002
    SYSTEM_VERSION = 0x0004
    VOLTAGE_RMS = 0x0006
    LINE_FREQUENCY = 0x0008
    POWER_FACTOR_1 = 0x000A
    CURRENT_RMS_1 = 0x000E
    ACTIVE_POWER_1 = 0x0016
    REACTIVE_POWER_1 = 0x001E
    APPARENT_POWER_1 = 0x0026
    IMPORT_ACTIVE_1 = 0x002E
    EXPORT_ACTIVE_1 = 0x003E
    IMPORT_REACTIVE_1 = 0x004E
    EXPORT_REACTIVE_1 = 0x005E
    SYSTEM_CONFIG = 0x00A0
    ACCUMULATION_INTERVAL = 0x00A8


# What one poll reads: status … active power 2 (28 bytes), then reactive, apparent and the
# import-active accumulators (32 bytes), then the export-active accumulators (16 bytes).
OUTPUT_BLOCK = (Register.SYSTEM_STATUS, 28)
POWER_BLOCK = (Register.REACTIVE_POWER_1, 32)
EXPORT_BLOCK = (Register.EXPORT_ACTIVE_1, 16)
OUTPUT_FORMAT = "<HHHHhhIIII"
POWER_FORMAT = "<IIIIQQ"

SIGN_ACTIVE = (1 << 4, 1 << 6)  # status bit set: channel 1 / 2 active power positive
SIGN_REACTIVE = (1 << 5, 1 << 7)
ENERGY_ENABLE = (1 << 8) | (1 << 9)  # system configuration: accumulate on both channels

VOLT_PER_LSB = 0.1
AMP_PER_LSB = 1e-4
WATT_PER_LSB = 0.01
HZ_PER_LSB = 1e-3
PF_PER_LSB = 1 / 32768
DEFAULT_ENERGY_UNIT_J = 3.6
MIN_USEFUL_N = 1  # N = 0 (one line cycle) gives wrong power factors and signs [unverified]
MAX_N = 8


def checksum(data: bytes) -> int:
    """Sum of the bytes mod 256: the last byte of every frame and every read reply."""
    return sum(data) & 0xFF


def frame(body: bytes) -> bytes:
    """``A5 <len> body <cs>`` with ``len`` the whole frame's length."""
    head = bytes([HEADER, len(body) + 3]) + body
    if len(head) + 1 > 0xFF:
        raise UsageError(f"MCP39F511N frame of {len(head) + 1} bytes is too long")
    return head + bytes([checksum(head)])


def read_frame(address: int, n: int) -> bytes:
    """Set the pointer to ``address`` and read ``n`` bytes."""
    if not 1 <= n <= MAX_READ_BYTES:
        raise UsageError(f"MCP39F511N reads 1-{MAX_READ_BYTES} bytes at a time, not {n}")
    return frame(bytes([Command.SET_POINTER, address >> 8, address & 0xFF, Command.READ, n]))


def write_frame(address: int, data: bytes) -> bytes:
    """Set the pointer to ``address`` and write ``data``."""
    if not 1 <= len(data) <= MAX_READ_BYTES:
        raise UsageError(f"MCP39F511N writes 1-{MAX_READ_BYTES} bytes at a time")
    return frame(bytes([Command.SET_POINTER, address >> 8, address & 0xFF, Command.WRITE,
                        len(data)]) + data)


def signed(magnitude: int, status: int, bit: int) -> int:
    """A power register's magnitude with the sign its status bit gives."""
    return magnitude if status & bit else -magnitude


@dataclass(frozen=True)
class Outputs:
    """One update of the output registers, in SI units (both channels: index 0 and 1)."""

    status: int
    voltage_v: float
    frequency_hz: float
    power_factor: tuple[float, float]
    current_a: tuple[float, float]
    active_w: tuple[float, float]
    raw: bytes  # the 28 bytes read: identical bytes mean the same update

    @staticmethod
    def unpack(raw: bytes) -> Outputs:
        status, _version, volts, freq, pf1, pf2, i1, i2, p1, p2 = struct.unpack(
            OUTPUT_FORMAT, raw)
        return Outputs(status, volts * VOLT_PER_LSB, freq * HZ_PER_LSB,
                       (pf1 * PF_PER_LSB, pf2 * PF_PER_LSB), (i1 * AMP_PER_LSB, i2 * AMP_PER_LSB),
                       (signed(p1, status, SIGN_ACTIVE[0]) * WATT_PER_LSB,
                        signed(p2, status, SIGN_ACTIVE[1]) * WATT_PER_LSB), raw)


@dataclass(frozen=True)
class Powers:
    """Reactive and apparent power and the import-active accumulators (raw counts)."""

    reactive_var: tuple[float, float]
    apparent_va: tuple[float, float]
    import_counts: tuple[int, int]

    @staticmethod
    def unpack(raw: bytes, status: int) -> Powers:
        q1, q2, s1, s2, e1, e2 = struct.unpack(POWER_FORMAT, raw)
        return Powers((signed(q1, status, SIGN_REACTIVE[0]) * WATT_PER_LSB,
                       signed(q2, status, SIGN_REACTIVE[1]) * WATT_PER_LSB),
                      (s1 * WATT_PER_LSB, s2 * WATT_PER_LSB), (e1, e2))


@dataclass(frozen=True)
class Accumulators:
    """All eight u64 energy accumulators, raw counts, channel 1 then 2 in each pair."""

    import_active: tuple[int, int]
    export_active: tuple[int, int]
    import_reactive: tuple[int, int]
    export_reactive: tuple[int, int]


class Mcp39f511:
    """The chip's commands as methods; every reply is checked byte by byte."""

    def __init__(self, transport: ByteTransport, name: str | None = None) -> None:
        self.transport = transport
        self.port = name or str(getattr(transport, "port_name", "mcp39f511"))

    def _ack(self, sent: bytes) -> None:
        try:
            first = self.transport.read(1)[0]
        except MeterTimeoutError as e:
            raise MeterTimeoutError(f"{self.port}: no answer to frame {sent.hex(' ')}: {e}") \
                from e
        if first == Reply.NAK:
            raise MeterProtocolError(f"{self.port}: NAK to frame {sent.hex(' ')} "
                                     "(command not understood)")
        if first == Reply.CSFAIL:
            raise MeterProtocolError(f"{self.port}: the chip says the checksum of frame "
                                     f"{sent.hex(' ')} failed")
        if first != Reply.ACK:
            raise MeterProtocolError(f"{self.port}: answer starts with 0x{first:02X}, "
                                     "expected ACK 0x06, NAK 0x15 or CSFAIL 0x51")

    def _send(self, data: bytes) -> None:
        self.transport.reset_input()
        self.transport.write(data)
        self._ack(data)

    def _data_reply(self, sent: bytes, n: int) -> bytes:
        """``<len> <data…> <cs>`` after the ACK: the length and the checksum are checked."""
        try:
            length = self.transport.read(1)[0]
            if length != n + 3:
                raise MeterProtocolError(f"{self.port}: reply length byte {length}, expected "
                                         f"{n + 3} for {n} data bytes (offset 1)")
            rest = self.transport.read(n + 1)
        except MeterTimeoutError as e:
            raise MeterTimeoutError(f"{self.port}: reply to {sent.hex(' ')} cut short: {e}") \
                from e
        data, got = rest[:n], rest[n]
        want = checksum(bytes([Reply.ACK, length]) + data)
        if got != want:
            raise MeterProtocolError(f"{self.port}: reply checksum 0x{got:02X} at offset "
                                     f"{n + 2}, bytes give 0x{want:02X}")
        return data

    def read(self, address: int, n: int) -> bytes:
        """Register read: ``n`` bytes from ``address``."""
        sent = read_frame(address, n)
        self._send(sent)
        return self._data_reply(sent, n)

    def write(self, address: int, data: bytes) -> None:
        """Register write: ``data`` from ``address`` (RAM only until saved to flash)."""
        self._send(write_frame(address, data))

    def save_to_flash(self) -> None:
        """Keep the calibration and configuration registers over a power cycle."""
        self._send(frame(bytes([Command.SAVE_TO_FLASH])))

    def read_eeprom_page(self, page: int) -> bytes:
        """One 16-byte page of the 512-byte user EEPROM."""
        _check_page(page)
        sent = frame(bytes([Command.READ_EEPROM_PAGE, page]))
        self._send(sent)
        return self._data_reply(sent, EEPROM_PAGE_BYTES)

    def write_eeprom_page(self, page: int, data: bytes) -> None:
        _check_page(page)
        if len(data) != EEPROM_PAGE_BYTES:
            raise UsageError(f"an EEPROM page is {EEPROM_PAGE_BYTES} bytes, not {len(data)}")
        self._send(frame(bytes([Command.WRITE_EEPROM_PAGE, page]) + data))

    # -- registers by meaning ------------------------------------------------------------
    def read_u16(self, register: int) -> int:
        return int(struct.unpack("<H", self.read(register, 2))[0])

    def read_u32(self, register: int) -> int:
        return int(struct.unpack("<I", self.read(register, 4))[0])

    def system_version(self) -> int:
        """Factory date code: a harmless read that tells the chip is there."""
        return self.read_u16(Register.SYSTEM_VERSION)

    def accumulation_n(self) -> int:
        """N of the accumulation interval; a value outside 0..8 is refused, not restored later.

        Why here: a source sets its own N and puts the found one back at close; a found N
        the chip cannot take would only fail then, in a thread, with the chip left changed.
        """
        n = self.read_u16(Register.ACCUMULATION_INTERVAL)
        if not 0 <= n <= MAX_N:
            raise MeterError(f"{self.port}: the accumulation interval register (0x"
                             f"{Register.ACCUMULATION_INTERVAL:04X}) reads N = {n}, outside "
                             f"0..{MAX_N}: not an MCP39F511N, or its configuration is corrupt "
                             "(set N with Microchip's utility, then try again)")
        return n

    def set_accumulation_n(self, n: int) -> None:
        """Outputs update every 2^n line cycles (not saved to flash)."""
        if not 0 <= n <= MAX_N:
            raise UsageError(f"accumulation interval N {n} outside 0..{MAX_N}")
        self.write(Register.ACCUMULATION_INTERVAL, struct.pack("<H", n))

    def system_config(self) -> int:
        return self.read_u32(Register.SYSTEM_CONFIG)

    def set_system_config(self, value: int) -> None:
        self.write(Register.SYSTEM_CONFIG, struct.pack("<I", value))

    def read_outputs(self) -> Outputs:
        return Outputs.unpack(self.read(*OUTPUT_BLOCK))

    def read_powers(self, status: int) -> Powers:
        return Powers.unpack(self.read(*POWER_BLOCK), status)

    def read_export(self) -> tuple[int, int]:
        e1, e2 = struct.unpack("<QQ", self.read(*EXPORT_BLOCK))
        return int(e1), int(e2)

    def read_accumulators(self) -> Accumulators:
        """All eight accumulators in two 32-byte reads."""
        a = struct.unpack("<4Q", self.read(Register.IMPORT_ACTIVE_1, 32))
        r = struct.unpack("<4Q", self.read(Register.IMPORT_REACTIVE_1, 32))
        return Accumulators((a[0], a[1]), (a[2], a[3]), (r[0], r[1]), (r[2], r[3]))


def _check_page(page: int) -> None:
    if not 0 <= page < EEPROM_PAGES:
        raise UsageError(f"EEPROM page {page} outside 0..{EEPROM_PAGES - 1}")


def identify(transport: ByteTransport) -> str:
    """What ``wattlab devices`` shows: the system version read through a real frame."""
    try:
        version = Mcp39f511(transport).system_version()
    except MeterError as e:
        raise MeterProtocolError(f"no MCP39F511N answer: {e}") from e
    return f"MCP39F511N system version 0x{version:04X}"
