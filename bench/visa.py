"""SCPI analysers through real pyvisa-py: updates captured at each update rate, round trips.

    python bench/visa.py [--quick]

For every update rate the WT310E offers, the acquirer polls the emulator (over TCP, through
pyvisa-py) for a number of updates; captured / issued must be 100 % with none twice.
Round trip: median and 99th percentile of ``:NUM:NORM:VAL?`` queries.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from common import GOALS_MISSED, write_json
from wattlab.acquisition.acquirers import Chunk, Wt300eAcquirer
from wattlab.drivers.scpi import ScpiTransport
from wattlab.hardware.emulators.wt300e_emulator import Wt300eEmulator

RATES_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


def capture(rate_s: float, updates: int) -> dict[str, float]:
    with Wt300eEmulator("WT310E") as emu:
        acq = Wt300eAcquirer(emu.resource, "wall", rate_s=rate_s)
        acq.open()
        try:
            first_update = emu.updates
            times: list[np.ndarray] = []
            values: list[np.ndarray] = []
            deadline = time.monotonic() + rate_s * (updates + 0.5)
            while time.monotonic() < deadline:
                for item in acq.poll():
                    if isinstance(item, Chunk):
                        times.append(item.t_host_ns)
                        values.append(item.values)
            issued = emu.updates - first_update
        finally:
            acq.close()
    t = np.concatenate(times) if times else np.zeros(0, np.int64)
    v = np.concatenate(values) if values else np.zeros((0, 1))
    spacing = np.diff(t) / 1e9
    repeated = int(np.sum(np.all(v[1:] == v[:-1], axis=1))) if len(v) > 1 else 0
    return {"rate_s": rate_s, "issued": issued, "captured": len(t),
            "fraction": len(t) / issued if issued else 0.0, "repeated": repeated,
            "too_close": int(np.sum(spacing < 0.5 * rate_s))}


def round_trips(n: int) -> dict[str, float]:
    with Wt300eEmulator("WT310E") as emu:
        transport = ScpiTransport(emu.resource)
        try:
            transport.query("*IDN?")
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                transport.query(":NUM:NORM:VAL?")
                samples.append(time.perf_counter() - t0)
        finally:
            transport.close()
    ms = np.array(samples) * 1e3
    return {"queries": n, "median_ms": float(np.median(ms)),
            "p99_ms": float(np.percentile(ms, 99))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rates = RATES_S[:2] if args.quick else RATES_S
    rows = [capture(r, 10 if args.quick else max(6, int(30 / r) if r < 1 else 8))
            for r in rates]
    rtt = round_trips(50 if args.quick else 500)
    print("WT310E emulator through pyvisa-py (TCP socket): updates captured per rate")
    print(f"{'rate s':>7} {'issued':>7} {'captured':>9} {'captured %':>11} {'twice':>6}")
    for r in rows:
        print(f"{r['rate_s']:>7g} {r['issued']:>7} {r['captured']:>9} "
              f"{100 * r['fraction']:>10.1f}% {r['repeated'] + r['too_close']:>6}")
    print(f"query round trip :NUM:NORM:VAL?  median {rtt['median_ms']:.2f} ms, "
          f"p99 {rtt['p99_ms']:.2f} ms over {rtt['queries']} queries")
    write_json("visa", {"benchmark": "visa", "quick": args.quick, "rates": rows,
                        "round_trip": rtt})
    ok = all(r["fraction"] == 1.0 and r["repeated"] + r["too_close"] == 0 for r in rows)
    return 0 if ok else GOALS_MISSED


if __name__ == "__main__":
    sys.exit(main())
