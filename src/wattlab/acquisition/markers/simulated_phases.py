"""Phase markers for the simulated GPU's workload schedule (the demo's "workload").

A real workload marks its own phases through ``wattlab.phase``; the simulated GPU has no
program, so this acquirer reads the schedule and emits the same begin/end markers at the
instants the simulated load changes, letting the demo show energy per phase.
"""

from __future__ import annotations

import time

from wattlab.acquisition.acquirers import Reading
from wattlab.hardware.simulated_gpu import SimulatedGpu
from wattlab.samples import Marker, SourceDescriptor

POLL_S = 0.05


def schedule_phases(gpu: SimulatedGpu) -> list[tuple[float, float, str]]:
    """(start s, end s, name) of one pass, consecutive segments of one name merged."""
    phases: list[tuple[float, float, str]] = []
    t_s = 0.0
    for seg in gpu.schedule.segments:
        name = seg.name or f"util{seg.utilisation:.2f}"
        if phases and phases[-1][2] == name:
            phases[-1] = (phases[-1][0], t_s + seg.duration_s, name)
        else:
            phases.append((t_s, t_s + seg.duration_s, name))
        t_s += seg.duration_s
    return phases


class SchedulePhaseMarkers:
    """An acquirer with no data streams, only begin/end markers at phase boundaries."""

    def __init__(self, gpu: SimulatedGpu) -> None:
        self.gpu = gpu
        self.phases = schedule_phases(gpu)
        self._events = self._event_times()
        self._next = 0

    def _event_times(self) -> list[tuple[float, str, str]]:
        events = [(a, "begin", n) for a, _, n in self.phases]
        events += [(b, "end", n) for _, b, n in self.phases]
        return sorted(events, key=lambda e: (e[0], e[1] != "end"))

    def open(self) -> list[SourceDescriptor]:
        return []

    def _event(self, index: int) -> tuple[int, str, str]:
        cycle, within = divmod(index, len(self._events))
        t_s, kind, name = self._events[within]
        t_s += cycle * self.gpu.schedule.duration_s
        return self.gpu.start_ns + int(t_s * 1e9), kind, name

    def poll(self) -> list[Reading]:
        time.sleep(POLL_S)
        now = self.gpu.clock_ns()
        out: list[Reading] = []
        source = f"gpu{self.gpu.index}.schedule"
        while self.gpu.schedule.repeat or self._next < len(self._events):
            t_ns, kind, name = self._event(self._next)
            if t_ns > now:
                break
            out.append(Marker(t_ns, name, kind, source))
            self._next += 1
        return out

    def close(self) -> None:
        """Nothing to release; a phase still open is closed by the session's end marker."""
