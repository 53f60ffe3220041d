"""The pty base: a real pseudo-terminal opened with pyserial, hooks, streaming, faults."""

from __future__ import annotations

import time

import pytest

from tests.conftest import running
from wattlab.drivers.transport import SerialTransport
from wattlab.errors import MeterError, WattlabError
from wattlab.hardware.emulators.pty_device import PtyDevice


class EchoUpper(PtyDevice):
    """Answers every byte upper-cased; streams b'.' per tick while ``streaming``."""

    tick_interval_s = 0.002

    def __init__(self) -> None:
        super().__init__("echo")
        self.streaming = False
        self.ticks = 0

    def on_bytes(self, data: bytes) -> None:
        if data == b"s":
            self.streaming = True
        self.send(data.upper())

    def tick(self, now_ns: int) -> None:
        self.ticks += 1
        if self.streaming:
            self.send(b".")


@pytest.mark.fast
def test_path_before_start_is_an_error() -> None:
    with pytest.raises(WattlabError, match="not started"):
        _ = EchoUpper().path


@pytest.mark.system
def test_echo_through_pyserial() -> None:
    with EchoUpper() as dev:
        assert dev.path.startswith("/dev/pts/")
        t = SerialTransport(dev.path, timeout_s=1.0)
        try:
            t.write(b"hello\x00\xff\r\n")
            assert t.read(9) == b"HELLO\x00\xff\r\n"  # raw: no echo, no CR/LF mangling
        finally:
            t.close()
    assert dev.error is None


@pytest.mark.system
def test_tick_streams_and_large_writes_arrive_whole() -> None:
    with EchoUpper() as dev:
        t = SerialTransport(dev.path, timeout_s=1.0)
        try:
            payload = bytes(range(256)) * 400  # 100 kB, more than the pty buffer
            dev.send(payload)
            assert t.read(len(payload)) == payload
            t.write(b"s")
            assert t.read(1) == b"S"
            assert t.read(5) == b"....."
        finally:
            t.close()
        assert dev.ticks > 0


@pytest.mark.system
def test_stall_delays_replies() -> None:
    with EchoUpper() as dev:
        t = SerialTransport(dev.path, timeout_s=1.0)
        try:
            dev.stall(0.2)
            t0 = time.monotonic()
            t.write(b"a")
            assert t.read(1) == b"A"
            assert time.monotonic() - t0 >= 0.15
        finally:
            t.close()


@pytest.mark.system
def test_disconnect_makes_host_io_fail_not_hang() -> None:
    with EchoUpper() as dev:
        t = SerialTransport(dev.path, timeout_s=1.0)
        try:
            dev.disconnect()
            t0 = time.monotonic()
            with pytest.raises(MeterError, match=dev.path):
                t.read(1)
            assert time.monotonic() - t0 < 1.0
        finally:
            t.close()


@pytest.mark.system
def test_exclusive_lock_refuses_second_open() -> None:
    with EchoUpper() as dev:
        t = SerialTransport(dev.path)
        try:
            with pytest.raises(MeterError, match="cannot open"):
                SerialTransport(dev.path)
        finally:
            t.close()


class DiesOnTick(PtyDevice):
    """A device whose thread fails at its first tick."""

    def tick(self, now_ns: int) -> None:
        raise RuntimeError("device thread bug")


@pytest.mark.fast
def test_running_fails_when_the_device_thread_died() -> None:
    with pytest.raises(AssertionError, match="device thread bug"), \
            running(DiesOnTick("dies")) as dev:
        deadline = time.monotonic() + 5
        while dev.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
