"""Zeus's PowerMonitor as a peer in bench/nvml_compare.py: what a Zeus user gets.

    python bench/zeus_reader.py OUT_PREFIX      # runs until SIGTERM

Starts ``zeus.monitor.power.PowerMonitor`` on GPU 0 with its defaults (update period
inferred by Zeus, every power domain the GPU supports, each polled in its own spawned
process) and a ``ZeusMonitor`` window over the whole run. On SIGTERM it stops both and
writes ``OUT_PREFIX.<domain>.txt`` ('unix_ns mW' lines, Zeus's de-duplicated timeline) and
``OUT_PREFIX.window.txt`` (the window's start and end unix ns and its energy in J). The
spawned pollers are joined before exit, so the caller's ``wait4`` counts their CPU.
"""

from __future__ import annotations

import signal
import sys
import threading


def main() -> int:
    from zeus.monitor import ZeusMonitor
    from zeus.monitor.power import PowerMonitor

    prefix = sys.argv[1]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    power = PowerMonitor(gpu_indices=[0])
    energy = ZeusMonitor(gpu_indices=[0])
    energy.begin_window("run", sync_execution=False)
    begin_s = energy.measurement_states["run"].time
    stop.wait()
    window = energy.end_window("run", sync_execution=False)
    for domain in power.measurement_domains:
        timeline = power.get_power_timeline(domain, gpu_index=0)[0]
        with open(f"{prefix}.{domain.value}.txt", "w") as out:
            for t_s, power_w in timeline:
                out.write(f"{round(t_s * 1e9)} {round(power_w * 1000)}\n")
    power.stop()
    with open(f"{prefix}.window.txt", "w") as out:
        out.write(f"{round(begin_s * 1e9)} {round((begin_s + window.time) * 1e9)} "
                  f"{window.total_energy}\n")
    print(f"zeus: update period {power.update_period * 1000:.1f} ms, domains "
          f"{[d.value for d in power.measurement_domains]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
