"""What most tools do: poll nvmlDeviceGetPowerUsage every 100 ms. Writes 'unix_ns mW' lines.

    python nvml_poll_loop.py OUT [PERIOD_S] [GPUS]

GPUS (e.g. '0,1') polls each of those GPUs in every round and writes OUT.<gpu> per GPU;
without it, GPU 0 into OUT.
"""

from __future__ import annotations

import signal
import sys
import time
from contextlib import ExitStack

import pynvml


def main() -> int:
    out_path, period_s = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
    gpus = [int(g) for g in sys.argv[3].split(",")] if len(sys.argv) > 3 else None
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    pynvml.nvmlInit()
    with ExitStack() as files:
        if gpus is None:
            polled = [(pynvml.nvmlDeviceGetHandleByIndex(0), files.enter_context(
                open(out_path, "w")))]
        else:
            polled = [(pynvml.nvmlDeviceGetHandleByIndex(g), files.enter_context(
                open(f"{out_path}.{g}", "w"))) for g in gpus]
        next_t = time.monotonic()
        while not stop:
            for handle, out in polled:
                out.write(f"{time.time_ns()} {pynvml.nvmlDeviceGetPowerUsage(handle)}\n")
            next_t += period_s
            time.sleep(max(0.0, next_t - time.monotonic()))
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
