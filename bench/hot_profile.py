"""Where each microsecond of a wake-up goes: the NVML reader and the PowerSensor3 source.

    python bench/hot_profile.py nvml [--seconds 600] [--streams all] [--intervals ""]
    python bench/hot_profile.py recorder [--seconds 120] [--streams all] [--intervals ""]
    python bench/hot_profile.py ps3 [--seconds 10]

``nvml``: the NVML reader's wake-ups (``NvmlAcquirer.poll`` and the runner's publish onto a
real ZeroMQ socket) against the fake NVML, on a simulated clock: ``--seconds`` of recording
run back to back, so the figures are the Python around the calls and the fake's answers,
with warm caches (a real GPU after a sleep adds its cold-cache cost on top). Prints the
CPU per wake-up and cProfile's own-time per wake-up of the functions that cost most.

``recorder``: the same reader's messages into a real ``Recorder`` (bound socket, HDF5 run
file in SWMR mode) in this process, which handles what arrives and flushes once per emit,
as the recorder process does with its 20 ms gather: after ``WARMUP_EMITS``, the CPU per
emit of the handling and of the flush (timed apart), then cProfile's own time per emit of
the recorder's functions.

``ps3``: a real recording session of the emulated PowerSensor3 at 20 kHz, profiled in the
session's process (the source thread: read, decode, publish); the recorder is a separate
process and is measured by ``bench/ps3_stream.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from wattlab.acquisition.acquirers import NvmlAcquirer, parse_intervals
from wattlab.acquisition.session.source_runner import COALESCE_ROWS, SourceRunner
from wattlab.drivers.nvml import NvmlDriver
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import simulated_gpus
from wattlab.sync.bus import BusPublisher
from wattlab.sync.recorder.config import RecorderConfig
from wattlab.sync.recorder.process import Recorder

TOP = 14  # functions shown
WARMUP_EMITS = 10  # the recorder's first emits: new streams, the switch to SWMR; not counted
# the simulated GPU behind the fake NVML: a real GPU's driver does this work
FAKE_FILES = ("hardware/", "recursive_filter.py", "pynvml.py")


class SimulatedClock:
    """A monotonic clock that a sleep advances: wake-ups run back to back."""

    def __init__(self) -> None:
        self.now_ns = time.monotonic_ns()

    def __call__(self) -> int:
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)


def simulated_reader(streams: str, intervals: str) -> tuple[SimulatedClock, NvmlAcquirer]:
    """The NVML reader of one simulated GPU on a simulated clock (sleeping advances it)."""
    clock = SimulatedClock()
    lib = FakeNvml(simulated_gpus(1, 0, clock_ns=clock))
    return clock, NvmlAcquirer(NvmlDriver(lib), 0, streams=streams,
                               intervals_s=parse_intervals(intervals), clock_ns=clock,
                               sleep=clock.sleep)


def nvml_wakeups(seconds: float, streams: str, intervals: str, profile: cProfile.Profile | None
                 ) -> tuple[int, int]:
    """(wake-ups, thread CPU ns) of ``seconds`` of the reader on a simulated clock.

    With ``profile``, the wake-ups run under it (and cost more).
    """
    clock, acquirer = simulated_reader(streams, intervals)
    context: zmq.Context[Any] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="wattlab-prof-") as folder:
        endpoint = f"ipc://{folder}/bus.sock"
        sink = context.socket(zmq.ROUTER)
        sink.bind(endpoint)
        publisher = BusPublisher(endpoint, context, linger_ms=0, coalesce_rows=COALESCE_ROWS,
                                 backlog_bytes=1 << 26)
        runner = SourceRunner("gpu0", acquirer, endpoint)
        for desc in acquirer.open():
            publisher.announce(desc)
        end_ns = clock() + round(seconds * 1e9)
        wakeups = 0
        cpu0 = time.thread_time_ns()
        if profile is not None:
            profile.enable()
        while clock() < end_ns:
            runner._publish(publisher, acquirer.poll())
            wakeups += 1
        if profile is not None:
            profile.disable()
        cpu_ns = time.thread_time_ns() - cpu0
        acquirer.close()
        publisher.close(wait=False)
        sink.close(0)
    context.term()
    return wakeups, cpu_ns


def recorder_emits(seconds: float, streams: str, intervals: str,
                   profile: cProfile.Profile | None) -> tuple[int, int, int]:
    """(emits, handling CPU ns, flush CPU ns) of the recorder for ``seconds`` of the reader.

    The reader runs on a simulated clock and publishes to a real ``Recorder``; its own CPU is
    left out: only the recorder's calls are timed (and profiled).
    """
    clock, acquirer = simulated_reader(streams, intervals)
    context: zmq.Context[Any] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="wattlab-prof-") as folder:
        endpoint = f"ipc://{folder}/bus.sock"
        recorder = Recorder(RecorderConfig(endpoint, f"{folder}/run.h5", time.monotonic_ns(),
                                           swmr_after_s=0.0), context)
        publisher = BusPublisher(endpoint, context, linger_ms=0, coalesce_rows=COALESCE_ROWS,
                                 backlog_bytes=1 << 26)
        runner = SourceRunner("gpu0", acquirer, endpoint)
        for desc in acquirer.open():
            publisher.announce(desc)
        publisher.flush()
        end_ns = clock() + round(seconds * 1e9)
        emits = handle_ns = flush_ns = seen = 0
        while clock() < end_ns:
            readings = acquirer.poll()
            runner._publish(publisher, readings)
            if not readings:
                continue
            time.sleep(0.002)  # the messages reach the bound socket (the gather's role)
            warm = seen > WARMUP_EMITS
            seen += 1
            if profile is not None and warm:
                profile.enable()
            t0 = time.thread_time_ns()
            for frames in recorder._sockets.local_messages():
                recorder.handle(frames)
            t1 = time.thread_time_ns()
            recorder.flush()
            t2 = time.thread_time_ns()
            if profile is not None and warm:
                profile.disable()
            if not warm:
                continue
            emits += 1
            handle_ns += t1 - t0
            flush_ns += t2 - t1
        acquirer.close()
        publisher.close(wait=False)
        recorder.request_stop()
        recorder._finish()
    context.term()
    return emits, handle_ns, flush_ns


def ps3_session(seconds: float) -> tuple[int, int, pstats.Stats]:
    """(rows, source thread CPU ns, profile of the session process) of a 20 kHz recording."""
    from wattlab.acquisition.acquirers import PowerSensor3Acquirer
    from wattlab.acquisition.session import Session
    from wattlab.hardware.emulators.powersensor3_emulator import PowerSensor3Emulator
    from wattlab.runfile import Run

    # the thread's own CPU clock: time waiting for the GIL (the emulator runs in this
    # process) is not the source's cost
    profile = cProfile.Profile(time.thread_time_ns, 1e-9)
    cpu_ns = [0]

    def sample_cpu(_elapsed_s: float) -> None:
        for thread in threading.enumerate():
            if thread.name == "source-ps3" and thread.ident:
                cpu_ns[0] = time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))

    def profile_source_thread(*_: Any) -> None:  # the source thread only, not the emulator's
        if threading.current_thread().name == "source-ps3":
            profile.enable()
        else:
            sys.setprofile(None)

    threading.setprofile(profile_source_thread)
    with tempfile.TemporaryDirectory(prefix="wattlab-prof-") as folder:
        out = str(Path(folder) / "ps3.h5")
        with PowerSensor3Emulator(lambda t: 300.0) as emu:
            Session(out, [("ps3", PowerSensor3Acquirer(emu.path, "ps3"))], duration_s=seconds,
                    on_progress=sample_cpu).run()
        threading.setprofile(None)  # type: ignore[arg-type]
        with Run(out) as run:
            rows = len(run.source("ps3"))
    return rows, cpu_ns[0], pstats.Stats(profile)


def own_time_s(stats: pstats.Stats, skip: tuple[str, ...]) -> float:
    """Seconds of wattlab's own Python (and pyzmq's), the simulated GPU and built-ins apart."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    return sum(tottime for (path, _, _), (_, _, tottime, _, _) in raw.items()
               if ("wattlab" in path or "zmq" in path) and not any(s in path for s in skip))


def show(stats: pstats.Stats, per: int, what: str, skip: tuple[str, ...] = ()) -> None:
    """The functions with the most own time, in µs per ``what``; files under ``skip`` left out."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    mine = [kv for kv in raw.items() if not any(s in kv[0][0] or s in kv[0][2] for s in skip)]
    rows = sorted(mine, key=lambda kv: kv[1][2], reverse=True)[:TOP]
    print(f"{'own µs/' + what:>14} {'calls/' + what:>12}  function")
    for (path, line, name), (_, ncalls, tottime, _, _) in rows:
        print(f"{1e6 * tottime / per:>14.2f} {ncalls / per:>12.2f}  "
              f"{Path(path).name}:{line}({name})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("nvml", "recorder", "ps3"))
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--streams", default="all")
    parser.add_argument("--intervals", default="")
    args = parser.parse_args()
    if args.what == "nvml":
        seconds = args.seconds or 600.0
        wakeups, cpu_ns = nvml_wakeups(seconds, args.streams, args.intervals, None)
        profile = cProfile.Profile()
        _, profiled_ns = nvml_wakeups(seconds, args.streams, args.intervals, profile)
        stats = pstats.Stats(profile)
        own_us = 1e6 * own_time_s(stats, FAKE_FILES) / wakeups
        print(f"NVML reader ({args.streams}{', ' + args.intervals if args.intervals else ''}),"
              f" {seconds:g} simulated s on the fake NVML: {wakeups} wake-ups, "
              f"{cpu_ns / 1e3 / wakeups:.1f} µs CPU each (the fake's simulation included); "
              f"profiled {profiled_ns / 1e3 / wakeups:.1f} µs, of which wattlab's and pyzmq's "
              f"own Python {own_us:.1f} µs")
        show(stats, wakeups, "wake", skip=FAKE_FILES)
    elif args.what == "recorder":
        seconds = args.seconds or 120.0
        emits, handle_ns, flush_ns = recorder_emits(seconds, args.streams, args.intervals, None)
        profile = cProfile.Profile()
        recorder_emits(seconds, args.streams, args.intervals, profile)
        print(f"recorder, NVML reader ({args.streams}"
              f"{', ' + args.intervals if args.intervals else ''}), {seconds:g} simulated s: "
              f"{emits} emits, CPU per emit: handling the messages {handle_ns / 1e3 / emits:.0f}"
              f" µs, the flush {flush_ns / 1e3 / emits:.0f} µs")
        show(pstats.Stats(profile), emits, "emit")
    else:
        seconds = args.seconds or 10.0
        rows, cpu_ns, stats = ps3_session(seconds)
        print(f"PowerSensor3 20 kHz, {seconds:g} s: {rows} rows, source thread "
              f"{100 * cpu_ns / 1e9 / seconds:.2f} % of a core (profiled)")
        show(stats, rows // 1000 or 1, "1k rows", skip=("select",))
    return 0


if __name__ == "__main__":
    sys.exit(main())
