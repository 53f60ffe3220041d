"""Byte transports for drivers: a driver gets one and never opens a port itself.

Keeping the port outside the driver is what lets protocol tests swap in a transport that
checks every byte, and integration tests run the same driver over a real pty.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

from wattlab.errors import MeterError, MeterTimeoutError


class ByteTransport(Protocol):
    """What a serial-style driver needs from its port."""

    def write(self, data: bytes) -> None:
        """Send all of ``data``."""
        ...

    def read(self, n: int) -> bytes:
        """Return exactly ``n`` bytes or raise ``MeterTimeoutError``."""
        ...

    def read_available(self, max_n: int) -> bytes:
        """Return what has arrived (up to ``max_n``), waiting at most the read timeout."""
        ...

    def reset_input(self) -> None:
        """Drop unread input (before a command whose reply must be read clean)."""
        ...

    def close(self) -> None:
        """Release the port."""
        ...


class SerialTransport:
    """A pyserial port in raw 8N1 with an exclusive lock (two readers corrupt each other)."""

    def __init__(
        self,
        port: str,
        baudrate: int = 115200,
        timeout_s: float = 1.0,
        rts: bool | None = None,
        dtr: bool | None = None,
    ) -> None:
        import serial

        self.port_name = port
        self.timeout_s = timeout_s
        try:
            self._port = serial.Serial(
                port, baudrate=baudrate, timeout=timeout_s, exclusive=True,
                write_timeout=timeout_s,
            )
        except (serial.SerialException, OSError, ValueError) as e:
            raise MeterError(f"{port}: cannot open serial port: {e}") from e
        try:
            if rts is not None:
                self._port.rts = rts
            if dtr is not None:
                self._port.dtr = dtr
        except (serial.SerialException, OSError, ValueError) as e:
            self._port.close()
            raise MeterError(f"{port}: cannot set RTS/DTR: {e}") from e

    def write(self, data: bytes) -> None:
        import serial

        try:
            self._port.write(data)
            self._port.flush()
        except (serial.SerialException, OSError) as e:
            raise MeterError(f"{self.port_name}: write failed: {e}") from e

    def read(self, n: int) -> bytes:
        import serial

        deadline = time.monotonic() + self.timeout_s
        out = bytearray()
        try:
            while len(out) < n:
                out += self._port.read(n - len(out))
                if len(out) < n and time.monotonic() >= deadline:
                    raise MeterTimeoutError(f"{self.port_name}: expected {n} bytes, "
                                            f"got {len(out)} in {self.timeout_s} s")
        except (serial.SerialException, OSError) as e:
            raise MeterError(f"{self.port_name}: read failed: {e}") from e
        return bytes(out)

    def read_available(self, max_n: int) -> bytes:
        """What has arrived, in one system call; with nothing there, wait for a byte.

        Why not pyserial's ``in_waiting`` then ``read``: that is an ioctl, a select and a
        read with timeout bookkeeping, ~5 times the CPU of the one ``os.read`` on the
        non-blocking descriptor pyserial opened, and a 20 kHz stream is read 200 times a
        second (issue 39).
        """
        import serial

        try:
            data = self._read_now(max_n)
            if data:
                return data
            # nothing yet, or a hang-up (an empty read): pyserial waits and tells them apart
            waiting = self._port.in_waiting
            return bytes(self._port.read(min(max_n, waiting) if waiting else 1))
        except (serial.SerialException, OSError) as e:
            raise MeterError(f"{self.port_name}: read failed: {e}") from e

    def _read_now(self, max_n: int) -> bytes:
        """Up to ``max_n`` bytes already there (b"": none, or the port has no descriptor)."""
        fd = getattr(self._port, "fd", None)
        if not isinstance(fd, int) or max_n <= 0:
            return b""
        try:
            return os.read(fd, max_n)
        except BlockingIOError:
            return b""

    def reset_input(self) -> None:
        self._port.reset_input_buffer()

    def set_baudrate(self, baudrate: int) -> None:
        self._port.baudrate = baudrate

    def close(self) -> None:
        self._port.close()


def open_serial(port: str, timeout_s: float = 0.1) -> SerialTransport:
    """Every serial source's port: 115 200 8N1, exclusive, timeout short for prompt polls."""
    return SerialTransport(port, timeout_s=timeout_s)
