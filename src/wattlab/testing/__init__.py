r"""Helpers for testing instrument drivers, wattlab's and a plugin's: scripted transports.

A driver test is three lines::

    def test_counter() -> None:
        with expected_protocol(PowerSensor3, [(b"Q", b"\x10\x27\x00\x80")]) as ps:
            assert ps.read_counter() == 0x80002710

The names load on first use: pytest imports this package's ``pytest_plugin`` (the fixtures
of the same names, through wattlab's ``pytest11`` entry point) in every run wherever wattlab
is installed, and that costs no driver import. The helpers need only the standard library
and what the drivers import; never pytest. Guide: docs/testing-drivers.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wattlab.testing.byte_script import ByteExchange, ExpectedProtocol
    from wattlab.testing.scpi_script import Reply, ScriptedTextTransport, TextExchange
    from wattlab.testing.scripted_drivers import expected_protocol, expected_scpi

_MODULE_OF = {
    "ByteExchange": "byte_script",
    "ExpectedProtocol": "byte_script",
    "Reply": "scpi_script",
    "ScriptedTextTransport": "scpi_script",
    "TextExchange": "scpi_script",
    "expected_protocol": "scripted_drivers",
    "expected_scpi": "scripted_drivers",
}


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        return getattr(import_module(f"wattlab.testing.{_MODULE_OF[name]}"), name)
    raise AttributeError(f"module 'wattlab.testing' has no attribute {name!r}")


__all__ = [
    "ByteExchange",
    "ExpectedProtocol",
    "Reply",
    "ScriptedTextTransport",
    "TextExchange",
    "expected_protocol",
    "expected_scpi",
]
