"""The toy meter's wire protocol: ASCII lines, one answer per command.

The host writes ``*IDN?`` or ``READ?`` and a newline; the meter answers one line:
``TOY,METER,<serial>,<firmware>``, or ``<n>,<volts>,<amps>`` where ``n`` counts the readings
it took since power-on, so a reading lost or read twice shows. Anything else: ``ERR``.
"""

from __future__ import annotations

from dataclasses import dataclass

from wattlab.drivers.transport import ByteTransport
from wattlab.errors import MeterProtocolError

MAX_LINE_BYTES = 64  # no answer is longer: more means the bytes are not this meter's


@dataclass(frozen=True)
class ToySample:
    """One reading, in SI units, with the meter's own count of readings."""

    count: int
    voltage_v: float
    current_a: float


class ToyMeter:
    """The protocol over a transport it is given: a serial port, or a test's script."""

    def __init__(self, transport: ByteTransport, name: str = "toy") -> None:
        self.transport = transport
        self.name = name

    def identify(self) -> str:
        """``*IDN?``, after dropping what an earlier user of the port left unread."""
        self.transport.reset_input()
        answer = self.query("*IDN?")
        if not answer.startswith("TOY,"):
            raise MeterProtocolError(f"{self.name}: not a toy meter: *IDN? answered {answer!r}")
        return answer

    def read(self) -> ToySample:
        answer = self.query("READ?")
        try:
            count, volts, amps = answer.split(",")
            return ToySample(int(count), float(volts), float(amps))
        except ValueError as e:
            raise MeterProtocolError(f"{self.name}: READ? answered {answer!r}") from e

    def query(self, command: str) -> str:
        """One command line out, one answer line back (a silent meter: MeterTimeoutError)."""
        self.transport.write(f"{command}\n".encode("ascii"))
        line = bytearray()
        while not line.endswith(b"\n"):
            if len(line) >= MAX_LINE_BYTES:
                raise MeterProtocolError(f"{self.name}: {command} answered {bytes(line)!r}...")
            line += self.transport.read(1)
        try:
            return line.decode("ascii").strip()
        except UnicodeDecodeError as e:
            raise MeterProtocolError(f"{self.name}: {command} answered {bytes(line)!r}") from e
