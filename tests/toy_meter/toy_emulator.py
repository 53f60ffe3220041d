"""A toy meter on a pseudo-terminal, written from the protocol's description, not the driver.

It measures a load ``power_w(t_ns)`` at a fixed 12 V and answers with the meter's
resolution: volts to the millivolt, amps to 0.1 mA. Like a line-based instrument it drops
a partial command older than 50 ms, so bytes another program left on the port (``wattlab
devices`` probing for other meters) do not spoil the next command.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from wattlab.hardware.emulators.pty_device import PtyDevice, serve_until_interrupted

VOLTS = 12.0
STALE_NS = 50_000_000
IDENTITY = b"TOY,METER,0001,1.0\n"


class ToyEmulator(PtyDevice):
    """Answers ``*IDN?`` and ``READ?``; counts its readings as the meter does."""

    def __init__(self, power_w: Callable[[int], float]) -> None:
        super().__init__("toy")
        self.power_w = power_w
        self.readings = 0
        self._rx = bytearray()
        self._rx_ns = 0

    def on_bytes(self, data: bytes) -> None:
        now_ns = time.monotonic_ns()
        if now_ns - self._rx_ns > STALE_NS:
            self._rx.clear()
        self._rx_ns = now_ns
        self._rx += data
        while b"\n" in self._rx:
            line, _, rest = bytes(self._rx).partition(b"\n")
            self._rx = bytearray(rest)
            self.send(self.answer(line.strip(), now_ns))

    def answer(self, command: bytes, now_ns: int) -> bytes:
        if command == b"*IDN?":
            return IDENTITY
        if command == b"READ?":
            self.readings += 1
            amps = float(self.power_w(now_ns)) / VOLTS
            return f"{self.readings},{VOLTS:.3f},{amps:.4f}\n".encode("ascii")
        return b"ERR\n"


def run_emulator_cli(power_w: Callable[[int], float]) -> int:
    """Serve the toy meter until Ctrl-C, printing the port to open."""
    return serve_until_interrupted(ToyEmulator(power_w))
