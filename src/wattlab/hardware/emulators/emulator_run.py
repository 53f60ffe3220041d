"""How a ``wattlab emulate`` run ends: on a stop signal, cleanly, with 130, leaving nothing.

Why: every emulator already stops cleanly on Ctrl-C (it closes its pty or socket and stops
its threads when KeyboardInterrupt unwinds it), but SIGTERM killed it mid-way, Ctrl-C ended
it with 0 where docs/cli.md promises 130 for every command, and the RAPL emulator left its
powercap tree in the temporary folder. One wrapper around any emulator, plugins' included,
fixes all three without each emulator knowing: SIGTERM and SIGHUP take Ctrl-C's path, the
run's temporary files go into a folder of its own that is removed however the run ends.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_STOPPED = 130  # docs/cli.md: after Ctrl-C, as for every command


@dataclass
class StopSignal:
    """The stop signal the run received, if any."""

    signum: int | None = None


def run_until_stopped(emulate: Callable[[], int]) -> int:
    """Run ``emulate`` (it serves until KeyboardInterrupt); 130 if a stop signal ended it.

    Else the emulator's own status (1 when it failed on its own).
    """
    with private_temp_folder(), stop_signals_interrupt() as received:
        try:
            status = emulate()
        except KeyboardInterrupt:  # landed before the emulator's own handler was entered
            status = EXIT_STOPPED
    return EXIT_STOPPED if received.signum is not None else status


@contextmanager
def stop_signals_interrupt() -> Iterator[StopSignal]:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt, once.

    A second signal during the clean stop is noted, not raised: it cannot cut it short.
    """
    received = StopSignal()

    def handler(signum: int, frame: Any) -> None:
        first = received.signum is None
        received.signum = signum
        if first:
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def private_temp_folder() -> Iterator[str]:
    """Point ``tempfile`` at a new folder for the run; remove it and its contents at the end.

    What an emulator writes there (the emulated powercap tree, issue 38) goes with it.
    """
    folder = tempfile.mkdtemp(prefix="wattlab-emulate-")
    previous = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield folder
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(folder, ignore_errors=True)
