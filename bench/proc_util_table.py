"""The per-process stream, rebuilt from a pairs run's ``proc_util`` markers (bench only).

tests/data/traces/h200_shared-pairs.h5 was recorded before the per-process stream existed:
a thread marked each ``nvmlDeviceGetProcessUtilization`` sample as ``proc_util`` (pid,
SM %, memory %, the driver's unix µs). This builds what the stream would hold over a
window (docs/processes.md): the driver's stamps on the session clock (the conversion
gpu0.samples uses), each row over the interval since the GPU's previous stamp, a row of 0
for a process present at a stamp the driver did not name it in (the stream's rule for a
process that holds memory), each process present from its first stamp's interval to its
last stamp.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wattlab.analysis.attribution.process_table import Process, ProcessTable


def unix_to_session_ns(run: Any) -> int:
    """What to add to a driver unix ns to get session ns: gpu0.samples' own conversion."""
    view = run.source("gpu0.samples")
    return int(np.median(view.time_ns - np.asarray(view.time_raw, dtype=np.int64) * 1000))


def proc_util_table(markers: list[Any], offset_ns: int, pids: dict[int, str],
                    t0_ns: int, t1_ns: int) -> ProcessTable:
    """The processes ``pids`` (pid -> name) over [t0, t1] session ns (module doc)."""
    rows: dict[tuple[int, float], tuple[float, float]] = {}
    for m in markers:
        if m.name != "proc_util" or m.payload["pid"] not in pids:
            continue
        t_s = (m.payload["t_unix_us"] * 1000 + offset_ns) / 1e9
        if t0_ns / 1e9 <= t_s <= t1_ns / 1e9:
            rows[(m.payload["pid"], t_s)] = (m.payload["sm"] / 100, m.payload["mem"] / 100)
    stamps = sorted({t for _, t in rows})
    procs = []
    for pid, name in pids.items():
        own = [t for p, t in rows if p == pid]
        if not own:
            continue
        first, last = stamps.index(min(own)), stamps.index(max(own))
        proc = Process(f"gpu0:{pid}", {"gpu": 0, "pid": pid, "comm": name},
                       (stamps[max(first - 1, 0)], stamps[last]))
        for i in range(max(first, 1), last + 1):
            sm, mem = rows.get((pid, stamps[i]), (0.0, 0.0))
            proc.t0_s.append(stamps[i - 1])
            proc.t1_s.append(stamps[i])
            proc.sm.append(sm)
            proc.mem.append(mem)
        procs.append(proc)
    return ProcessTable(0, "gpu0.processes", procs, (t0_ns / 1e9, t1_ns / 1e9), [], [])
