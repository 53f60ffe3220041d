"""RAPL on a real host: `wattlab record --rapl` against the zones' own energy_uj counters.

    python bench/rapl_real.py [--seconds 60] [--root /sys/class/powercap]

Says first what the powercap folder holds (zones, or why none can be read, with the fix).
Then records N seconds with `wattlab record --nvml none --rapl ROOT` (a subprocess, as a
user runs it) while a CPU load runs for the middle third; meanwhile this script reads every
zone's energy_uj itself every 20 ms on the same monotonic clock, unwrapping on its own. Per
zone: the recording's energy from its first row to its last, against this script's own
counter interpolated to the same two instants; the goal is |difference| < 0.1 %.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from common import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import wattlab
from wattlab.acquisition.acquirers.rapl_acquirer import powercap_readable
from wattlab.drivers.powercap import discover, read_uj
from wattlab.errors import MeterError

OWN_PERIOD_S = 0.02


def own_reader(root: str, stop: threading.Event) -> tuple[list[str], list[int], list[list[int]]]:
    """Every zone's energy_uj every 20 ms, unwrapped here: (zone folders, t_ns, µJ rows)."""
    zones = discover(root)
    last = [read_uj(z, root) for z in zones]
    total = [0] * len(zones)
    times, rows = [time.monotonic_ns()], [list(total)]
    while not stop.wait(OWN_PERIOD_S):
        t0 = time.monotonic_ns()
        now = [read_uj(z, root) for z in zones]
        t = (t0 + time.monotonic_ns()) // 2
        for i, (z, a, b) in enumerate(zip(zones, last, now, strict=True)):
            total[i] += b - a if b >= a else b - a + z.max_energy_range_uj + 1
        last = now
        times.append(t)
        rows.append(list(total))
    return [str(z.path) for z in zones], times, rows


def cpu_load(seconds: float) -> None:
    """One busy core for ``seconds`` (a process: this one's reader keeps its 20 ms)."""
    subprocess.run([sys.executable, "-c", "import time\nd = time.monotonic() + "
                    f"{seconds}\nwhile time.monotonic() < d: pass"], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--root", default="/sys/class/powercap")
    parser.add_argument("--emulate", action="store_true",
                        help="an emulated two-socket tree instead (checks this script)")
    args = parser.parse_args()
    if args.emulate:
        from wattlab.hardware.emulators.powercap_emulator import PowercapEmulator, intel_server

        args.root = tempfile.mkdtemp(prefix="powercap-")
        PowercapEmulator(args.root, intel_server()).start()
    print(f"powercap: {powercap_readable(args.root)}")
    try:
        discover(args.root)
    except MeterError:
        write_json("rapl_real", {"readable": False, "why": powercap_readable(args.root)})
        return 1
    stop = threading.Event()
    own: dict[str, object] = {}
    reader = threading.Thread(target=lambda: own.update(result=own_reader(args.root, stop)))
    reader.start()
    time.sleep(0.5)
    out = Path(tempfile.mkdtemp()) / "rapl.h5"
    load = threading.Timer(args.seconds / 3, cpu_load, args=(args.seconds / 3,))
    load.start()
    subprocess.run([sys.executable, "-m", "wattlab.cli", "record", "--nvml", "none", "--rapl",
                    args.root, "--duration", str(args.seconds), "--no-live", "-o", str(out)],
                   check=True)
    load.join()
    time.sleep(0.5)
    stop.set()
    reader.join()
    folders, times, rows = own["result"]  # type: ignore[misc]
    t_own = np.array(times, dtype=np.float64)
    own_uj = np.array(rows, dtype=np.float64)
    results = []
    with wattlab.open(str(out)) as run:
        start_ns = int(run.attrs["session_start_monotonic_ns"])
        for view in (v for v in run.sources.values() if v.kind == "rapl"):
            zones = view.descriptor["config"]["zones"]
            t = view.time_ns.astype(np.float64) + start_ns
            for channel, zone in zones.items():
                recorded_j = float(view.channel(channel)[-1] - view.channel(channel)[0])
                column = folders.index(zone["path"])
                ends = np.interp([t[0], t[-1]], t_own, own_uj[:, column])
                own_j = float(ends[1] - ends[0]) / 1e6
                results.append({"stream": view.source_id, "channel": channel,
                                "seconds": (t[-1] - t[0]) / 1e9, "recorded_j": recorded_j,
                                "own_counter_j": own_j,
                                "diff_pct": 100 * (recorded_j - own_j) / own_j if own_j else None})
    print(f"{'stream:channel':<40} {'s':>7} {'recorded J':>12} {'own J':>12} {'diff %':>8}")
    for r in results:
        diff = f"{r['diff_pct']:8.4f}" if r["diff_pct"] is not None else f"{'-':>8}"
        print(f"{r['stream'] + ':' + r['channel']:<40} {r['seconds']:7.2f} "
              f"{r['recorded_j']:12.3f} {r['own_counter_j']:12.3f} {diff}")
    worst = max((abs(r["diff_pct"]) for r in results if r["diff_pct"] is not None), default=0.0)
    print(f"worst |difference|: {worst:.4f} % (goal < 0.1 %)")
    result = {"readable": True, "seconds": args.seconds, "zones": results, "worst_pct": worst}
    print(f"json: {write_json('rapl_real', result)}")
    return 0 if worst < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
