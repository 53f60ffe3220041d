"""The recording's own CPU, as a run file keeps it (``recording_cpu_json``) and shows it.

Why in every run file: a recorder that runs on every node all the time is judged by what it
costs; a user should see that on the run itself, not only in a benchmark. The session takes
each process's user and system CPU seconds (itself with its in-process sources, each source
process, the recorder) once everything is open and again when the sources are told to stop,
so the figure is the steady cost, start-up and the final drain left out. Old files lack the
attribute and show nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wattlab.runfile.schema import RECORDING_CPU_JSON


@dataclass(frozen=True)
class ProcessCpu:
    """One process's CPU seconds at the window's start and end (``None``: it had ended)."""

    pid: int
    start_user_s: float
    start_system_s: float
    end_user_s: float | None = None
    end_system_s: float | None = None

    @property
    def used_s(self) -> float | None:
        """User + system seconds inside the window, or None when the end is unknown."""
        if self.end_user_s is None or self.end_system_s is None:
            return None
        return (self.end_user_s - self.start_user_s) + (self.end_system_s - self.start_system_s)


@dataclass(frozen=True)
class RecordingCpu:
    """Each process of the recording tree, by role (``session``, a source's name, ``recorder``)."""

    start_monotonic_ns: int
    end_monotonic_ns: int
    processes: dict[str, ProcessCpu] = field(default_factory=dict)

    @property
    def window_s(self) -> float:
        return (self.end_monotonic_ns - self.start_monotonic_ns) / 1e9

    def percent_of_core(self, role: str) -> float | None:
        used = self.processes[role].used_s
        if used is None or self.window_s <= 0:
            return None
        return 100 * used / self.window_s

    def to_json(self) -> str:
        return json.dumps({"start_monotonic_ns": self.start_monotonic_ns,
                           "end_monotonic_ns": self.end_monotonic_ns,
                           "processes": {r: p.__dict__ for r, p in self.processes.items()}})

    @staticmethod
    def from_json(text: str) -> RecordingCpu:
        obj = json.loads(text)
        return RecordingCpu(int(obj["start_monotonic_ns"]), int(obj["end_monotonic_ns"]),
                            {r: ProcessCpu(**p) for r, p in obj["processes"].items()})


def read_recording_cpu(attrs: Any) -> RecordingCpu | None:
    """The record in a file's root attributes, or None (a file written before it existed)."""
    text = attrs.get(RECORDING_CPU_JSON)
    return None if text is None else RecordingCpu.from_json(str(text))


def recording_cpu_line(attrs: Any) -> str | None:
    """``wattlab info``'s line: the tree's CPU as % of one core, then each process's."""
    record = read_recording_cpu(attrs)
    if record is None:
        return None
    shares = {role: record.percent_of_core(role) for role in record.processes}
    known = [v for v in shares.values() if v is not None]
    parts = ", ".join(f"{role} {'ended' if v is None else f'{v:.3f}'}"
                      for role, v in shares.items())
    return (f"recording CPU: {sum(known):.3f} % of one core over {record.window_s:.1f} s "
            f"(user + system; {parts})")


def show_recording_cpu(attrs: Any) -> None:
    """Print ``recording_cpu_line`` where the file has the record."""
    line = recording_cpu_line(attrs)
    if line is not None:
        print(line)


MAX_RECORD_BYTES = 65536


def stop_attrs(head: Mapping[str, Any], host: str | None) -> dict[str, str]:
    """The root attributes a local session's ``stop`` request carries (its CPU record).

    Only from the local session (a remote agent has no say over the file's root), only a
    record that reads back; anything else is left out rather than failing the stop.
    """
    text = head.get("recording_cpu")
    if host is not None or not isinstance(text, str) or len(text) > MAX_RECORD_BYTES:
        return {}
    try:
        RecordingCpu.from_json(text)
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}
    return {RECORDING_CPU_JSON: text}
