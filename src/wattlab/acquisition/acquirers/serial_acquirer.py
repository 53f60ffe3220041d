"""What every serial meter's acquirer shares: its port, and letting go of it at close.

Why one place: a meter that died or was unplugged must still release its port at close,
whatever its farewell to the device (stop streaming, put a setting back) raised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from wattlab.drivers.transport import ByteTransport
from wattlab.errors import MeterError

Driver = TypeVar("Driver")


class SerialAcquirer(Generic[Driver]):
    """An acquirer over one serial port; subclasses say goodbye to the device in ``_farewell``."""

    def __init__(self, port: str, source_id: str,
                 transport_factory: Callable[[str], ByteTransport]) -> None:
        self.port = port
        self.source_id = source_id
        self.transport_factory = transport_factory
        self.driver: Driver | None = None
        self._transport: ByteTransport | None = None

    def _open_port(self) -> ByteTransport:
        self._transport = self.transport_factory(self.port)
        return self._transport

    def _farewell(self) -> None:
        """What the open device is told before its port goes (nothing, by default)."""

    def close(self) -> None:
        """Say goodbye to the device if it still answers; release the port in any case."""
        try:
            if self.driver is not None:
                self._farewell()
        except MeterError:  # a dead or unplugged device: the port must still be released
            pass
        finally:
            if self._transport is not None:
                self._transport.close()
                self._transport = None
            self.driver = None
