"""Taking the recording tree's CPU clocks (for ``recording_cpu_json``).

Why ``/proc/<pid>/stat``: it splits user from system time for any process of ours, the
session's children included, without a dependency; its 10 ms ticks are 0.0003 % of a core
over an hour-long run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from wattlab.runfile import ProcessCpu, RecordingCpu

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a process, or None when it has ended."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # after the command name, which may hold spaces
    return int(fields[11]) / TICKS_PER_S, int(fields[12]) / TICKS_PER_S  # utime, stime


class CpuWindow:
    """The CPU each process of a recording used between ``start`` and ``end``."""

    def __init__(self) -> None:
        self._start_ns = 0
        self._start: dict[str, tuple[int, tuple[float, float]]] = {}

    def start(self, pids: Mapping[str, int | None]) -> None:
        """Take each live process's clocks, by role; a process that is not there is left out."""
        self._start_ns = time.monotonic_ns()
        self._start = {}
        for role, pid in pids.items():
            cpu = None if pid is None else process_cpu_s(pid)
            if pid is not None and cpu is not None:
                self._start[role] = (pid, cpu)

    def end(self) -> RecordingCpu | None:
        """The record: None if ``start`` never ran (the session stopped while starting)."""
        if not self._start:
            return None
        end_ns = time.monotonic_ns()
        processes = {}
        for role, (pid, (user_s, system_s)) in self._start.items():
            now = process_cpu_s(pid)  # a process restarted since has another pid: None
            processes[role] = ProcessCpu(pid, user_s, system_s,
                                         *(now if now is not None else (None, None)))
        return RecordingCpu(self._start_ns, end_ns, processes)
