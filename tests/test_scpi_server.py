"""The reusable SCPI TCP server and the ``wattlab emulate`` entry point."""

import socket
import sys
import threading
from typing import Any

import pytest

from tests.conftest import ctrl_c, emulator_cli, running
from wattlab.drivers.scpi import ScpiTransport
from wattlab.hardware.emulators.scpi_server import ScpiCommand, ScpiDevice, ScpiTcpServer, WallLoad


def echo(cmd: ScpiCommand) -> str | bytes | None:
    if cmd.header == "BLOCK":
        return b"#15a\nb\nc"
    if cmd.query:
        return f"{cmd.header}|{'/'.join(cmd.args)}"
    if cmd.header == "BOOM":
        raise RuntimeError("handler bug")
    return None


@pytest.mark.system
def test_queries_compound_lines_and_blocks(rm: Any) -> None:
    server = ScpiTcpServer(echo)
    try:
        t = ScpiTransport(server.resource, rm)
        try:
            assert t.query("*IDN?") == "*IDN|"
            assert t.query(':A:B? 1,"x,y"') == ':A:B|1/"x,y"'
            assert t.query("SET 1;Q1?;Q2? 3") == "Q1|;Q2|3"
            t.write("BOOM")
            assert t.query_binary_block("BLOCK") == b"a\nb\nc"  # newlines inside survive
            assert t.query("AFTER?") == "AFTER|"
        finally:
            t.close()
        assert len(server.handler_errors) == 1 and "handler bug" in server.handler_errors[0]
    finally:
        server.close()


@pytest.mark.system
def test_close_ends_open_connections() -> None:
    server = ScpiTcpServer(echo)
    client = socket.create_connection(("127.0.0.1", server.port))
    try:
        client.sendall(b"PING?\n")
        assert client.recv(100) == b"PING|\n"
        before = threading.active_count()
        server.close()
        assert threading.active_count() <= before - 2
        assert client.recv(100) == b""  # the server side is closed
    finally:
        client.close()


@pytest.mark.fast
def test_wall_load_efficiency_curve() -> None:
    load = WallLoad(lambda t: 0.0, rest_w=0.0)
    for dc_w in (100.0, 500.0, 1000.0, 1500.0, 2000.0):
        assert 0.899 <= load.efficiency(dc_w) <= 0.941
    assert load.efficiency(1000.0) == pytest.approx(0.94)


@pytest.mark.system
def test_emulate_cli_serves_until_interrupted(rm: Any) -> None:
    code = "from wattlab.hardware.emulators.scpi_server import run_emulator_cli as r; " \
           "raise SystemExit(r('wt310e'))"
    with emulator_cli([sys.executable, "-c", code]) as (proc, line):
        resource = line.split(": ", 1)[1].strip()
        assert resource.startswith("TCPIP::127.0.0.1::") and resource.endswith("::SOCKET")
        t = ScpiTransport(resource, rm)
        try:
            assert t.query("*IDN?").startswith("YOKOGAWA,WT310E,")
        finally:
            t.close()
        assert ctrl_c(proc, 5) == 0


@pytest.mark.fast
def test_emulate_cli_rejects_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    from wattlab.hardware.emulators.scpi_server import run_emulator_cli

    assert run_emulator_cli("wt9000") == 2
    assert "unknown analyser" in capsys.readouterr().err


class Faulty(ScpiDevice):
    """An emulator with a bug in one command's handler."""

    COMMAND_PATTERNS = (("BOOM", "_boom"),)

    def __init__(self) -> None:
        super().__init__("TEST,FAULTY,0,0")

    def _boom(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> None:
        raise RuntimeError("handler bug")


@pytest.mark.system
def test_a_handler_failure_outlives_close_and_fails_running() -> None:
    """``running`` reads the record after the close, where it was once dropped (the check
    could not fail); the client never sees the failure, only the record has it."""
    with pytest.raises(AssertionError, match="handler bug"), running(Faulty()) as device:
        port = int(device.resource.split("::")[2])
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(b"BOOM;*IDN?\n")
            assert client.recv(100) == b"TEST,FAULTY,0,0\n"
    assert len(device.handler_errors) == 1 and "handler bug" in device.handler_errors[0]
