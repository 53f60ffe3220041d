"""The reusable SCPI TCP server and the ``wattlab emulate`` entry point."""

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import pyvisa

from wattlab.drivers.scpi import ScpiTransport
from wattlab.hardware.scpi_server import ScpiCommand, ScpiTcpServer, WallLoad


@pytest.fixture
def rm() -> Iterator[Any]:
    manager = pyvisa.ResourceManager("@py")
    yield manager
    manager.close()


def echo(cmd: ScpiCommand) -> str | bytes | None:
    if cmd.header == "BLOCK":
        return b"#15a\nb\nc"
    if cmd.query:
        return f"{cmd.header}|{'/'.join(cmd.args)}"
    if cmd.header == "BOOM":
        raise RuntimeError("handler bug")
    return None


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


def test_wall_load_efficiency_curve() -> None:
    load = WallLoad(lambda t: 0.0, rest_w=0.0)
    for dc_w in (100.0, 500.0, 1000.0, 1500.0, 2000.0):
        assert 0.899 <= load.efficiency(dc_w) <= 0.941
    assert load.efficiency(1000.0) == pytest.approx(0.94)


def test_emulate_cli_serves_until_interrupted(rm: Any) -> None:
    code = "from wattlab.hardware.scpi_server import run_emulator_cli as r; " \
           "raise SystemExit(r('wt310e'))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        resource = line.split(": ", 1)[1].strip()
        assert resource.startswith("TCPIP::127.0.0.1::") and resource.endswith("::SOCKET")
        t = ScpiTransport(resource, rm)
        try:
            assert t.query("*IDN?").startswith("YOKOGAWA,WT310E,")
        finally:
            t.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_emulate_cli_rejects_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    from wattlab.hardware.scpi_server import run_emulator_cli

    assert run_emulator_cli("wt9000") == 2
    assert "unknown analyser" in capsys.readouterr().err
