"""RAPL through `wattlab record --rapl` on an emulated tree that wraps every ~0.2 s: exact?

    python bench/rapl_emulated.py [--seconds 10]

The emulator (src/wattlab/hardware/emulators/powercap_emulator.py) advances a two-socket tree every
1 ms with short counter ranges (package 25 J, DRAM 4 J: a wrap every ~0.2 s) and logs
every value it writes, unwrapped. `wattlab record` reads the tree in its own process. A
value the recorder read was written by the emulator, so each recorded row, plus the value
the emulator had written when the stream opened, must be exactly one of the logged values:
the table counts the rows that are (the goal: all, to the µJ), the wraps crossed, and the
largest miss in µJ.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import wattlab
from wattlab.hardware.emulators.powercap_emulator import PowercapEmulator, Zone


def tree() -> list[Zone]:
    return [Zone(f"intel-rapl:{i}", f"package-{i}", [(0.7, 95.0 + 20 * i), (0.3, 160.0)],
                 max_energy_range_uj=25_000_000, max_power_w=250.0,
                 children=[Zone(f"intel-rapl:{i}:0", "dram", [(1.0, 18.0 + i)],
                                max_energy_range_uj=4_000_000, max_power_w=40.0)])
            for i in range(2)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="powercap-"))
    emulator = PowercapEmulator(root / "tree", tree()).start()
    out = root / "run.h5"
    subprocess.run([sys.executable, "-m", "wattlab.cli", "record", "--nvml", "none", "--rapl",
                    str(root / "tree"), "--duration", str(args.seconds), "--no-live", "-o",
                    str(out)], check=True, stdout=subprocess.DEVNULL)
    emulator.stop()
    log_t = np.array([t for t, _ in emulator.log])
    rows = []
    with wattlab.open(str(out)) as run:
        start_ns = int(run.attrs["session_start_monotonic_ns"])
        for view in (v for v in run.sources.values() if v.kind == "rapl"):
            t = view.time_ns + start_ns
            for channel, zone in view.descriptor["config"]["zones"].items():
                key = str(Path(zone["path"]).relative_to(root / "tree"))
                logged = np.array([c[key] for _, c in emulator.log], dtype=np.int64)
                z = dict((str(r), z) for r, z in emulator.zones)[key]
                shown = np.array([z.shown_uj(int(u)) for u in logged])
                # the value read at open: the logged write showing it, nearest the first row
                candidates = np.flatnonzero(shown == zone["first_energy_uj"])
                first = logged[candidates[np.argmin(np.abs(log_t[candidates] - t[0]))]]
                got = first + np.round(view.channel(channel) * 1e6).astype(np.int64)
                where = np.searchsorted(logged, got).clip(0, len(logged) - 1)
                miss = np.abs(logged[where] - got)
                wraps = int((got[-1] + first) // (zone["max_energy_range_uj"] + 1)
                            - first // (zone["max_energy_range_uj"] + 1))
                rows.append({"stream": view.source_id, "channel": channel, "rows": len(got),
                             "exact_rows": int((miss == 0).sum()), "wraps": wraps,
                             "max_miss_uj": int(miss.max()),
                             "energy_j": float(got[-1] - first) / 1e6})
    print(f"{'stream:channel':<34} {'rows':>6} {'exact':>6} {'wraps':>6} {'max miss µJ':>12} "
          f"{'energy J':>10}")
    for r in rows:
        print(f"{r['stream'] + ':' + r['channel']:<34} {r['rows']:6d} {r['exact_rows']:6d} "
              f"{r['wraps']:6d} {r['max_miss_uj']:12d} {r['energy_j']:10.3f}")
    print(f"json: {write_json('rapl_emulated', {'seconds': args.seconds, 'zones': rows})}")
    return 0 if all(r["exact_rows"] == r["rows"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
