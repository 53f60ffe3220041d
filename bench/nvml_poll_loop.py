"""What most tools do: poll nvmlDeviceGetPowerUsage every 100 ms. Writes 'unix_ns mW' lines."""

from __future__ import annotations

import signal
import sys
import time

import pynvml


def main() -> int:
    out_path, period_s = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with open(out_path, "w") as out:
        next_t = time.monotonic()
        while not stop:
            out.write(f"{time.time_ns()} {pynvml.nvmlDeviceGetPowerUsage(handle)}\n")
            next_t += period_s
            time.sleep(max(0.0, next_t - time.monotonic()))
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
