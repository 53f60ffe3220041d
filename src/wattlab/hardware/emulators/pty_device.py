"""An emulated serial device on a pseudo-terminal, the base of every serial emulator.

A driver under test opens ``.path`` with pyserial exactly as it would open a USB CDC port,
so the real transport (termios, exclusive lock, timeouts, hang-up) is exercised. A subclass
only says what the instrument does: ``on_bytes`` for what the host sent, ``tick`` for what
the instrument streams on its own; ``send`` queues its answers.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import sys
import threading
import time
import tty
from types import TracebackType

from wattlab.errors import WattlabError

DEFAULT_MAX_BACKLOG_BYTES = 8 * 1024 * 1024


class PtyDevice:
    """Owns a pty pair and one thread that reads host bytes, calls hooks and writes replies.

    The thread keeps the slave end open itself so the master never reports a hang-up
    before the host has opened the port (that would busy-loop the select).
    """

    tick_interval_s: float = 0.005

    def __init__(self, name: str = "pty-device",
                 max_backlog_bytes: int = DEFAULT_MAX_BACKLOG_BYTES) -> None:
        self.name = name
        self.max_backlog_bytes = max_backlog_bytes
        self.bytes_overflowed = 0
        self._master_fd = -1
        self._slave_fd = -1
        self._path = ""
        self._out = bytearray()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stall_until_s = 0.0
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # -- subclass hooks ------------------------------------------------------------------
    def on_bytes(self, data: bytes) -> None:
        """Handle bytes the host wrote (called on the device thread)."""

    def tick(self, now_ns: int) -> None:
        """Stream what is due at ``now_ns`` (monotonic; called on the device thread)."""

    def on_start(self, now_ns: int) -> None:
        """Called once on the device thread before the first tick."""

    # -- public API ----------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The slave device (``/dev/pts/N``) a host opens like a serial port."""
        if not self._path:
            raise WattlabError(f"{self.name}: emulator is not started")
        return self._path

    def start(self) -> PtyDevice:
        """Open the pty pair and start the device thread."""
        if self._thread is not None:
            raise WattlabError(f"{self.name}: emulator already started")
        master, slave = os.openpty()
        tty.setraw(slave)
        os.set_blocking(master, False)
        self._master_fd, self._slave_fd = master, slave
        self._path = os.ttyname(slave)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"emu-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and close both ends (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._close_fds()

    def send(self, data: bytes) -> None:
        """Queue bytes for the host; beyond the backlog limit they are dropped and counted.

        A real USB device whose host does not read loses data the same way.
        """
        with self._lock:
            room = self.max_backlog_bytes - len(self._out)
            if len(data) > room:
                self.bytes_overflowed += len(data) - max(room, 0)
                data = data[: max(room, 0)]
            self._out += data

    def stall(self, seconds: float) -> None:
        """Stop reading, writing and ticking for ``seconds`` (a hung USB device)."""
        self._stall_until_s = time.monotonic() + seconds

    @property
    def stalled(self) -> bool:
        return time.monotonic() < self._stall_until_s

    def disconnect(self) -> None:
        """Close the master end: the host sees a hang-up, as when a cable is pulled."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        if self._master_fd >= 0:
            os.close(self._master_fd)
            self._master_fd = -1

    def pending_output(self) -> int:
        """Bytes queued but not yet taken by the pty (for tests)."""
        with self._lock:
            return len(self._out)

    def __enter__(self) -> PtyDevice:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- device thread -------------------------------------------------------------------
    def _close_fds(self) -> None:
        for attr in ("_master_fd", "_slave_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, attr, -1)

    def _run(self) -> None:
        try:
            self.on_start(time.monotonic_ns())
            next_tick = time.monotonic()
            while not self._stop.is_set():
                now = time.monotonic()
                if now < self._stall_until_s:
                    self._stop.wait(min(self._stall_until_s - now, 0.05))
                    continue
                if now >= next_tick:
                    self.tick(time.monotonic_ns())
                    next_tick = max(next_tick + self.tick_interval_s, now)
                self._pump(max(0.0, next_tick - time.monotonic()))
        except BaseException as e:  # keep the failure for the test to see
            self.error = e

    def _pump(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for host bytes or room to write, then move bytes."""
        fd = self._master_fd
        with self._lock:
            want_write = bool(self._out)
        readable, writable, _ = select.select([fd], [fd] if want_write else [], [], wait_s)
        if readable:
            try:
                data = os.read(fd, 65536)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EIO):
                    raise
                data = b""
            if data:
                self.on_bytes(data)
        if writable:
            with self._lock:
                try:
                    n = os.write(fd, self._out[:65536])
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EIO):
                        raise
                    n = 0
                del self._out[:n]


def serve_until_interrupted(device: PtyDevice) -> int:
    """Run an emulator until Ctrl-C, printing the port a driver should open.

    The whole run is inside the handler: a Ctrl-C that lands as the port is printed, before
    the wait loop, is a clean stop too (0 here; ``wattlab emulate`` exits 130 after it,
    hardware/emulators/emulator_run.py), not a death by SIGINT.
    """
    try:
        with device:
            print(device.path, flush=True)
            while device.error is None:
                time.sleep(0.2)
    except KeyboardInterrupt:
        return 0
    print(f"emulator failed: {device.error}", file=sys.stderr)
    return 1
