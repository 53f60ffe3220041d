"""wattlab's pytest plugin: the driver-test helpers as fixtures.

pytest loads it through wattlab's ``pytest11`` entry point (``wattlab``) wherever wattlab is
installed, so a plugin package's tests use the fixtures without an import. Loading it costs
one import of this module: the helpers are imported when a test first asks for a fixture.

``expected_protocol(Driver, script, *args, **kwargs)`` and ``expected_scpi(...)`` return the
driver built on the scripted transport, as the context managers of the same names yield it;
the scripts are checked when the test function returns, and a script left unfinished fails
the test (not its teardown). A test that fails on its own is reported with its own error.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from wattlab.testing.byte_script import ExpectedProtocol
    from wattlab.testing.scpi_script import ScriptedTextTransport

_SCRIPTS = pytest.StashKey["list[ExpectedProtocol | ScriptedTextTransport]"]()


def _scripts(request: pytest.FixtureRequest) -> list[ExpectedProtocol | ScriptedTextTransport]:
    return request.node.stash.setdefault(_SCRIPTS, [])


@pytest.fixture
def expected_protocol(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """A serial driver on a scripted port, its script checked when the test returns.

    ``expected_protocol(Driver, [(written, reply), ...], *args, **kwargs)``.
    """
    from wattlab.testing.scripted_drivers import byte_script

    def build(driver: Callable[..., Any], script: Any, /, *args: Any, **kwargs: Any) -> Any:
        transport = byte_script(script)
        _scripts(request).append(transport)
        return driver(transport, *args, **kwargs)

    return build


@pytest.fixture
def expected_scpi(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """A SCPI driver on a scripted instrument, its script checked when the test returns.

    ``expected_scpi(Driver, [(command, reply), ...], *args, **kwargs)``.
    """
    from wattlab.testing.scripted_drivers import scpi_script

    def build(driver: Callable[..., Any], script: Any, /, *args: Any, **kwargs: Any) -> Any:
        transport = scpi_script(script)
        _scripts(request).append(transport)
        return driver(transport, *args, **kwargs)

    return build


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """After a test function that returned, every script its fixtures built is finished."""
    __tracebackhide__ = True
    yield  # a test that raised stops here, with its own error
    for transport in item.stash.get(_SCRIPTS, []):
        transport.assert_consumed()
