"""AMD GPUs on the fake amdsmi: is the recorded energy exact across a 32-bit wrap?

    python bench/amd_fake.py [--seconds 20]

Records a simulated MI300X (``wattlab.hardware.fake_amdsmi``, driven by the simulated GPU
physics) through the real session, bus and recorder, with firmware that wraps the energy
accumulator at 32 bits and a count started 2 s of full power below the top, so the run
crosses a wrap. Compares, over the span between the first and the last counter read: the
recorded counter energy, the simulated GPU's true energy, and the integrated
``average_socket_power`` and ``current_socket_power`` (whole watts). A second run with a
counter that counts 60 % of the joules checks that the node report flags it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from common import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import wattlab
from wattlab.acquisition.acquirers import NvmlAcquirer
from wattlab.acquisition.session import Session
from wattlab.analysis.energy import node_report
from wattlab.device_models import WorkloadSchedule
from wattlab.drivers.amdsmi import AmdSmiDriver
from wattlab.hardware.fake_amdsmi import MI300X, RESOLUTION_UJ, FakeAmdSmi
from wattlab.hardware.simulated_gpu import SimulatedGpu


def record(folder: Path, name: str, seconds: float, **fake: Any) -> tuple[str, SimulatedGpu]:
    gpu = SimulatedGpu(seed=7, model=MI300X, schedule=WorkloadSchedule.random(7, 3600.0))
    driver = AmdSmiDriver(FakeAmdSmi([gpu], **fake))
    out = str(folder / f"{name}.h5")
    Session(out, [("amd0", NvmlAcquirer(driver, 0, intervals_s={"energy": 1.0}))],
            duration_s=seconds).run()
    return out, gpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="amd-fake-"))
    start_units = 2**32 - round(2 * 1000.0 / (RESOLUTION_UJ * 1e-6))
    out, gpu = record(folder, "wrap", args.seconds, counter_bits=32, start_units=start_units)
    with wattlab.open(out) as run:
        start_ns = int(run.attrs["session_start_monotonic_ns"])
        energy = run.source("amd0.energy")
        e_j = energy.channel("energy_j")
        t_ns = energy.time_ns + start_ns
        power = run.source("amd0.power")
        p_t = power.time_ns + start_ns
        window = (p_t >= t_ns[0]) & (p_t <= t_ns[-1])
        integrated = {ch: float(np.trapezoid(power.channel(ch)[window], p_t[window] / 1e9))
                      for ch in ("average_power_w", "instant_power_w")}
        covered_s = float((p_t[window][-1] - p_t[window][0]) / 1e9)
        notes = node_report(run)["notes"]
    true_j = gpu.true_energy_j(int(t_ns[0]), int(t_ns[-1]))
    counter_j = float(e_j[-1] - e_j[0])
    rows = [{"what": "counter (unwrapped)", "energy_j": counter_j},
            {"what": "true (simulated GPU)", "energy_j": true_j},
            {"what": "average_socket_power integrated", "energy_j": integrated["average_power_w"]},
            {"what": "current_socket_power integrated", "energy_j": integrated["instant_power_w"]}]
    for r in rows:
        r["vs_true_pct"] = 100 * (r["energy_j"] - true_j) / true_j
    bad_out, _ = record(folder, "implausible", min(args.seconds, 8.0), counter_scale=0.6)
    with wattlab.open(bad_out) as run:
        bad_notes = node_report(run)["notes"]
    span_s = (t_ns[-1] - t_ns[0]) / 1e9
    print(f"fake MI300X, {span_s:.1f} s between the first and last counter read "
          f"(power rows cover {covered_s:.1f} s), counter wrapped at 32 bits: "
          f"{bool(np.all(np.diff(e_j) > 0))} monotonic")
    print(f"{'energy':<34} {'J':>12} {'vs true %':>10}")
    for r in rows:
        print(f"{r['what']:<34} {r['energy_j']:12.3f} {r['vs_true_pct']:+10.4f}")
    print(f"plausibility notes, sound counter: {len(notes)}; counter at 60 %: {len(bad_notes)}"
          + (f" ({bad_notes[0][:90]}...)" if bad_notes else ""))
    result = {"seconds": args.seconds, "span_s": span_s, "rows": rows,
              "monotonic": bool(np.all(np.diff(e_j) > 0)), "notes_sound": notes,
              "notes_implausible": bad_notes}
    print(f"json: {write_json('amd_fake', result)}")
    ok = abs(rows[0]["vs_true_pct"]) < 0.01 and not notes and len(bad_notes) == 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
