"""A tuner process for the signal tests: tunes the simulated GPU through the API.

It prints ``changed`` once a setting other than the default is in force, then, after
``run_tune`` returns, the simulated GPU's settings as JSON: what the restore left.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from wattlab.acquisition.experiments.sweep_runner import open_driver
from wattlab.commands.tune import simulated_training
from wattlab.tuning.online import TunePlan, run_tune
from wattlab.tuning.search import SearchConfig


def main(output: str, duration_s: float, watchdog_log: str) -> None:
    driver, gpu, _ = open_driver(True, 0, schedule=simulated_training(0))

    def watch() -> None:
        while gpu.locked_clocks_mhz is None:
            time.sleep(0.05)
        print("changed", flush=True)

    threading.Thread(target=watch, daemon=True).start()
    plan = TunePlan(["sm_clock"], SearchConfig(min_iters=3, max_iters=5), duration_s=duration_s)
    try:
        run_tune(plan, driver, output, simulate=True, watchdog_log=watchdog_log)
    finally:
        print(json.dumps({"locked_clocks_mhz": gpu.locked_clocks_mhz,
                          "power_limit_w": gpu.power_limit_w}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3])
