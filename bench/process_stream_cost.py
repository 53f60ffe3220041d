"""What the per-process stream adds to the NVML reader's CPU (issue 41: at most 0.05 % of a core).

    python bench/process_stream_cost.py [--seconds 10] [--real] [--processes 3]
                                        [--every 0.9]

The reader (``NvmlAcquirer``, every stream but the processes stream, then with it) polls in
real time in a thread for ``--seconds``; its CPU is that thread's clock, % of one core,
median of 3 runs each. Both are run in turn, three times, so a load on the machine falls
on both. Also, one read of the processes stream (the two NVML calls and the bookkeeping),
µs of CPU, median over 200, and what it costs at one read per 0.9 s: the difference the
stream can make, free of the noise of two whole readers. ``--every S``: the processes
stream read every S s (``--nvml-intervals processes=S``; 0.15 reads every driver sample).
Without ``--real`` the GPU is the
simulated shared one (``--processes`` processes: the simulator's own work is counted, so
this is an upper bound); ``--real`` reads GPU 0 (run a CUDA process on it for rows).
Table on stdout, JSON in bench/results/process_stream_cost.json.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from common import doc_parser, median, write_json
from wattlab.acquisition.acquirers import NvmlAcquirer
from wattlab.acquisition.acquirers.nvml_cadence import parse_intervals
from wattlab.acquisition.acquirers.process_stream import ProcessReader
from wattlab.drivers.nvml import NvmlDriver
from wattlab.errors import UsageError

WITHOUT = "samples,power,energy,state"
WITH = "all"


def library(real: bool, processes: int) -> Any:
    """pynvml (None: the driver's default) or the fake NVML of a shared simulated GPU."""
    if real:
        return None
    from wattlab.hardware.fake_nvml import FakeNvml
    from wattlab.hardware.shared_gpu import shared_simulated_gpu

    return FakeNvml([shared_simulated_gpu(processes, 1, span_s=3600.0)])


def reader_cpu_pct(lib: Any, streams: str, seconds: float, every_s: float) -> float:
    """The reader thread's CPU over ``seconds`` of polling, % of one core (after its open)."""
    acq = NvmlAcquirer(NvmlDriver(lib), 0, streams=streams,
                       intervals_s=parse_intervals({"processes": every_s}))
    acq.open()
    result: list[float] = []

    def loop() -> None:
        t0, end = time.thread_time_ns(), time.monotonic() + seconds
        while time.monotonic() < end:
            acq.poll()
        result.append((time.thread_time_ns() - t0) / 1e9 / seconds * 100)

    try:
        thread = threading.Thread(target=loop)
        thread.start()
        thread.join()
    finally:
        acq.close()
    return result[0]


def one_read_us(lib: Any, reads: int = 200) -> tuple[float, float]:
    """CPU µs of one read of the processes stream, medians: (the NVML calls, the bookkeeping).

    The bookkeeping is wattlab's own (new samples, rows, markers, /proc for a new pid); on
    the simulated GPU the calls are the simulator's.
    """
    driver = NvmlDriver(lib)
    driver.open()
    offset_ns = time.time_ns() - time.monotonic_ns()
    stream = ProcessReader(driver, 0, "gpu0.processes", t_ns=time.monotonic_ns(),
                           unix_minus_monotonic_ns=offset_ns).stream
    calls, own = [], []
    try:
        for _ in range(reads):
            time.sleep(0.005)  # not back to back: closer to a read after a sleep
            t0 = time.thread_time_ns()
            samples, memory_b = driver.read_processes(0, stream.last_seen_us)
            t1 = time.thread_time_ns()
            now = time.monotonic_ns()
            stream.update(samples, memory_b, (now + offset_ns) // 1000, now)
            t2 = time.thread_time_ns()
            calls.append((t1 - t0) / 1000)
            own.append((t2 - t1) / 1000)
    finally:
        driver.close()
    return median(calls), median(own)


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--real", action="store_true", help="read GPU 0 through NVML")
    parser.add_argument("--processes", type=int, default=3,
                        help="simulated processes sharing the GPU (without --real)")
    parser.add_argument("--every", default="0.9", help="the processes stream's cadence (s)")
    args = parser.parse_args()
    try:
        every_s = parse_intervals({"processes": args.every})["processes"]
    except UsageError as e:
        parser.error(str(e))
    lib = library(args.real, args.processes)
    runs: dict[str, list[float]] = {WITHOUT: [], WITH: []}
    for _ in range(3):
        for streams, values in runs.items():
            values.append(reader_cpu_pct(lib, streams, args.seconds, every_s))
    calls_us, own_us = one_read_us(lib)
    without, with_ = median(runs[WITHOUT]), median(runs[WITH])
    per_read_pct = (calls_us + own_us) / 1e6 / every_s * 100
    own_pct = own_us / 1e6 / every_s * 100
    gpu = "GPU 0 (NVML)" if args.real else f"simulated H100 shared by {args.processes}"
    print(f"NVML reader CPU, % of one core, median of 3 x {args.seconds:g} s, {gpu}")
    print(f"{'streams':<32} {'runs':<26} {'median':>8}")
    for streams, values in runs.items():
        print(f"{streams:<32} {', '.join(f'{v:.3f}' for v in values):<26} {median(values):8.3f}")
    print(f"difference {with_ - without:+.3f} % of a core; one processes read: NVML calls "
          f"{calls_us:.0f} µs + bookkeeping {own_us:.0f} µs of CPU = {per_read_pct:.4f} % of a "
          f"core at one read per {every_s:g} s ({own_pct:.4f} % the bookkeeping; "
          "goal <= 0.05 %)")
    path = write_json("process_stream_cost", {
        "gpu": gpu, "seconds": args.seconds, "every_s": every_s, "runs_pct": runs,
        "median_without_pct": without, "median_with_pct": with_,
        "difference_pct": with_ - without, "one_read_nvml_calls_cpu_us": calls_us,
        "one_read_bookkeeping_cpu_us": own_us, "per_read_pct_of_core": per_read_pct,
        "bookkeeping_pct_of_core": own_pct})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
