"""PowerSensor3 end to end: emulator at 20 kHz -> pty -> driver -> bus -> recorder -> HDF5.

    python bench/ps3_stream.py [--seconds 60] [--quick]

Counts frames the emulator wrote against rows in the run file (goal: zero lost), the CPU
time of the source thread (read + decode + publish; goal under 30 % of one core) and of the
recorder process (receive + append + flush), each % of one core over the recording.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import GOALS_MISSED, child_pids, tree_cpu_s, write_json
from wattlab.acquisition.acquirers import PowerSensor3Acquirer
from wattlab.acquisition.session import Session
from wattlab.hardware.emulators.powersensor3_emulator import PowerSensor3Emulator
from wattlab.runfile import Run


class ThreadCpu:
    """Samples the CPU time of the thread named ``source-<name>`` while it runs, and of the
    recorder (this process's child: the emulator and the source are threads in here)."""

    def __init__(self, name: str) -> None:
        self.name = f"source-{name}"
        self.cpu_s = 0.0
        self.recorder_cpu_s = 0.0

    def __call__(self, elapsed_s: float) -> None:
        for thread in threading.enumerate():
            if thread.name == self.name and thread.native_id is not None:
                clock = time.pthread_getcpuclockid(thread.ident or 0)
                self.cpu_s = time.clock_gettime(clock)
        self.recorder_cpu_s = sum(tree_cpu_s(pid) for pid in child_pids(os.getpid()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="5 s instead of 60")
    args = parser.parse_args()
    seconds = 5.0 if args.quick else args.seconds
    with tempfile.TemporaryDirectory(prefix="wattlab-ps3-") as folder:
        out = str(Path(folder) / "ps3.h5")
        cpu = ThreadCpu("ps3")
        with PowerSensor3Emulator(lambda t: 300.0) as emu:
            session = Session(out, [("ps3", PowerSensor3Acquirer(emu.path, "ps3"))],
                              duration_s=seconds, on_progress=cpu)
            result = session.run()
            sent = emu.frames_sent
            lost_in_emulator = emu.frames_lost
        with Run(out) as run:
            rows = len(run.source("ps3"))
            gaps = len(run.gaps)
            span_s = float(run.source("ps3").time_ns[-1] - run.source("ps3").time_ns[0]) / 1e9
    cpu_pct = 100 * cpu.cpu_s / span_s
    recorder_pct = 100 * cpu.recorder_cpu_s / span_s
    lost = sent - rows
    print(f"PowerSensor3 emulator -> run file, {seconds:g} s at 20 kHz")
    print(f"{'frames sent':>12} {'rows in file':>13} {'lost':>6} {'gaps':>5} "
          f"{'source CPU % of a core':>23} {'recorder CPU %':>15}")
    print(f"{sent:>12} {rows:>13} {lost:>6} {gaps:>5} {cpu_pct:>23.2f} {recorder_pct:>15.2f}")
    write_json("ps3_stream", {"benchmark": "ps3_stream", "quick": args.quick, "seconds": seconds,
                              "frames_sent": sent,
                              "rows": rows, "lost": lost, "gaps": gaps,
                              "emulator_frames_lost": lost_in_emulator,
                              "source_cpu_pct_of_core": cpu_pct,
                              "recorder_cpu_pct_of_core": recorder_pct,
                              "recorder": result.recorder_status.get("sources", {})})
    return 0 if lost == 0 and gaps == 0 else GOALS_MISSED


if __name__ == "__main__":
    sys.exit(main())
