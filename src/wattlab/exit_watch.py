"""Sleep until a process ends, or until woken, without waking up to poll.

Why: a watcher that polls every 0.5 s pays a wake-up each time (~100 µs of CPU on an H200;
two a second were the whole 0.02 % a session's supervisor cost next to the NVML reader's
0.14 %, issue 10) and notices a death up to 0.5 s late. On Linux a pidfd becomes readable
the moment its process ends, so one ``poll`` over the pidfds and a wake pipe sleeps until
something happens and sees it at once. Where pidfds are missing (macOS, a kernel before
5.3, a sandbox that refuses the call) the wait falls back to looking every
``POLL_FALLBACK_S``, which is what every watcher did before.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import subprocess
import threading
from collections.abc import Callable, Iterable
from typing import Any

POLL_FALLBACK_S = 0.5  # without pidfds: how soon a process's end is noticed

_pidfd_open: Callable[[int], int] | None = getattr(os, "pidfd_open", None)
Watched = subprocess.Popen[Any] | int  # a child, or any process by pid (the parent)


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it has ended); None where pidfds are unavailable.

    Raises ProcessLookupError if the process is already gone.
    """
    if _pidfd_open is None:
        return None
    try:
        return _pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError:  # ENOSYS (old kernel), EPERM (seccomp): poll instead
        return None


class ExitWatch:
    """Waits for any of some processes to end, for ``wake``, or for a timeout.

    One thread waits (and closes it); ``wake`` may come from any thread or a signal
    handler, and a wake with nobody waiting ends the next ``wait`` at once, so none is
    lost. Processes are kept by identity, not pid: a pid may be reused by a restarted child.
    """

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._lock = threading.RLock()  # RLock: a signal handler may interrupt a wake
        self._closed = False
        self._pidfds: dict[Watched, int | None] = {}

    def wake(self) -> None:
        """End the current or the next ``wait`` (a no-op once closed)."""
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(BlockingIOError):  # full: woken many times already
                os.write(self._write_fd, b"\0")

    def wait(self, processes: Iterable[Watched], timeout_s: float | None) -> None:
        """Return when one of ``processes`` has ended, on ``wake``, or after ``timeout_s``.

        A process is a child (``Popen``) or any process by pid, such as the parent. The
        caller then looks at what happened (``Popen.poll``, ``os.getppid``). Children
        already reaped are not watched: one that ended and was reaped must not end every
        later wait at once.
        """
        live = [p for p in processes if isinstance(p, int) or p.returncode is None]
        fds = [self._read_fd]
        polling = False
        for stale in set(self._pidfds) - set(live):
            self._close_pidfd(stale)
        for process in live:
            if process not in self._pidfds:
                try:
                    self._pidfds[process] = open_pidfd(
                        process if isinstance(process, int) else process.pid)
                except ProcessLookupError:
                    return  # gone already: the caller's poll() will say so
            fd = self._pidfds[process]
            polling |= fd is None
            if fd is not None:
                fds.append(fd)
        if polling:
            timeout_s = POLL_FALLBACK_S if timeout_s is None else min(timeout_s, POLL_FALLBACK_S)
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        ready = poller.poll(None if timeout_s is None else max(0, math.ceil(timeout_s * 1000)))
        if any(fd == self._read_fd for fd, _ in ready):
            with contextlib.suppress(BlockingIOError):
                os.read(self._read_fd, 4096)

    def _close_pidfd(self, process: Watched) -> None:
        fd = self._pidfds.pop(process)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Release the pipe and the pidfds (once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for process in list(self._pidfds):
                self._close_pidfd(process)
            os.close(self._read_fd)
            os.close(self._write_fd)
