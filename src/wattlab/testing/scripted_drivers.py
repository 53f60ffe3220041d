"""A driver built on a scripted transport for the length of a ``with`` block.

``expected_protocol`` (serial drivers, bytes) and ``expected_scpi`` (SCPI drivers, text
commands) build the driver as ``driver(transport, *args, **kwargs)`` — every wattlab driver
takes its transport first, and a plugin's should too — and yield it. When the block ends
normally the whole script must have been played: nothing left unmade, no reply byte unread.
When the block raises, that error is the test's outcome and the script is not checked (a
driver error expected on purpose goes in ``pytest.raises`` inside the block, so the script
is still checked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from wattlab.testing.byte_script import ByteExchange, ExpectedProtocol
from wattlab.testing.scpi_script import ScriptedTextTransport, TextExchange

if TYPE_CHECKING:
    from wattlab.drivers.scpi import TextTransport
    from wattlab.drivers.transport import ByteTransport

P = ParamSpec("P")
D = TypeVar("D")


def byte_script(script: Sequence[ByteExchange] | ExpectedProtocol) -> ExpectedProtocol:
    """The script as a transport; one already built (a subclass, say) is used as it is."""
    return script if isinstance(script, ExpectedProtocol) else ExpectedProtocol(script)


def scpi_script(script: Sequence[TextExchange] | ScriptedTextTransport
                ) -> ScriptedTextTransport:
    """The script as a transport; one already built (another resource name) as it is."""
    if isinstance(script, ScriptedTextTransport):
        return script
    return ScriptedTextTransport(script)


@contextmanager
def expected_protocol(driver: Callable[Concatenate[ByteTransport, P], D],
                      script: Sequence[ByteExchange] | ExpectedProtocol, /,
                      *args: P.args, **kwargs: P.kwargs) -> Iterator[D]:
    r"""A serial driver on a port that plays ``script``: ``(written, reply)`` byte pairs.

    ``with expected_protocol(PmdUsb, [(b"\x01", b"\xee\x0a\x06")]) as pmd:`` builds
    ``PmdUsb(port, *args, **kwargs)``; the port is ``pmd.transport``.
    """
    __tracebackhide__ = True  # pytest shows the test's ``with``, not this frame
    transport = byte_script(script)
    yield driver(transport, *args, **kwargs)
    transport.assert_consumed()


@contextmanager
def expected_scpi(driver: Callable[Concatenate[TextTransport, P], D],
                  script: Sequence[TextExchange] | ScriptedTextTransport, /,
                  *args: P.args, **kwargs: P.kwargs) -> Iterator[D]:
    """A SCPI driver on an instrument that plays ``script``: ``(command, reply)`` pairs."""
    __tracebackhide__ = True  # pytest shows the test's ``with``, not this frame
    transport = scpi_script(script)
    yield driver(transport, *args, **kwargs)
    transport.assert_consumed()
