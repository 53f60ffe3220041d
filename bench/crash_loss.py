"""What a crash of a whole recording costs, per NVML cadence: kill -9 at random instants.

    python bench/crash_loss.py [--kills 10] [--frugal-kills 5]

Each kill starts `wattlab record --simulate` (one simulated GPU, threads) in its own
process group, waits for its first rows, waits a random time, and kills the whole group
with SIGKILL (the session, its source threads and the recorder: nothing is left to say
"end" or to flush). It then reads the file as `wattlab info` does and, per stream, takes
the time from the last row on disk to the kill: the readings of that span are what the
crash lost. The bound docs/run-file.md and docs/reliability.md give is ``emit`` (what the
NVML reader holds before it sends) plus the drain's lead where it does not line up with the
emit, plus the recorder's flush interval (0.5 s); each cadence is measured against it.
Writes bench/results/crash_loss.json.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import write_json
from wattlab.acquisition.acquirers import DEFAULT_INTERVALS_S, FRUGAL_INTERVALS, parse_intervals
from wattlab.runfile import Run, schema

FLUSH_INTERVAL_S = 0.5  # the session's recorder flush interval (Session.flush_interval_s)
STREAMS = ("gpu0.power", "gpu0.samples")


def bound_s(intervals: str) -> float:
    """emit + flush, plus the drain's lead where drain and emit are not in step."""
    cadence = {**DEFAULT_INTERVALS_S, **parse_intervals(intervals)}
    emit_s, drain_s = cadence["emit"], cadence["drain"]
    in_step = (emit_s / drain_s) == round(emit_s / drain_s)
    return emit_s + (0.0 if in_step else drain_s) + FLUSH_INTERVAL_S


def _first_rows(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with Run(str(path)) as run:
                if STREAMS[0] in run.sources and len(run.source(STREAMS[0])):
                    return
        except Exception:  # not created yet, or caught between two writes
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{path}: no rows within {timeout_s} s")


def one_kill(folder: str, intervals: str, index: int, rng: random.Random) -> dict[str, float]:
    """Seconds from the last row on disk to the kill, per stream."""
    path = Path(folder) / f"kill_{intervals or 'default'}_{index}.h5"
    argv = [sys.executable, "-m", "wattlab.cli", "record", "--simulate", "--duration", "600",
            "--no-live", "-o", str(path)]
    if intervals:
        argv += ["--nvml-intervals", intervals]
    session = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    emit_s = {**DEFAULT_INTERVALS_S, **parse_intervals(intervals)}["emit"]
    try:
        _first_rows(path, 60 + 2 * emit_s)
        time.sleep(rng.uniform(0.5, 0.5 + 2 * emit_s))  # anywhere in the emit cycle
        t_kill_ns = time.monotonic_ns()
        os.killpg(session.pid, signal.SIGKILL)
    finally:
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
        session.wait()
    with Run(str(path)) as run:
        t0_ns = int(run.attrs[schema.SESSION_START_MONOTONIC_NS])
        return {sid: round((t_kill_ns - t0_ns - int(run.source(sid).time_ns[-1])) / 1e9, 3)
                for sid in STREAMS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=10, help="kills at the default cadence")
    parser.add_argument("--frugal-kills", type=int, default=5, help="kills at the frugal one")
    parser.add_argument("--seed", type=int, default=36)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out: dict[str, Any] = {"benchmark": "crash_loss", "flush_interval_s": FLUSH_INTERVAL_S}
    lines = ["| cadence (--nvml-intervals) | kills | bound s | " +
             " | ".join(f"{sid} lost s (min-max)" for sid in STREAMS) + " |",
             "|---|---|---|" + "---|" * len(STREAMS)]
    with tempfile.TemporaryDirectory(prefix="wattlab-crash-") as folder:
        for name, intervals, kills in (("default", "", args.kills),
                                       ("frugal", FRUGAL_INTERVALS, args.frugal_kills)):
            losses = [one_kill(folder, intervals, i, rng) for i in range(kills)]
            print(f"  done: {name} {losses}", file=sys.stderr)
            spans = {sid: [loss[sid] for loss in losses] for sid in STREAMS}
            out[name] = {"intervals": intervals or "defaults", "bound_s": bound_s(intervals),
                         "losses_s": losses}
            lines.append(f"| {name} (`{intervals or 'defaults'}`) | {kills} | "
                         f"{bound_s(intervals):g} | " + " | ".join(
                             f"{min(v):.2f}-{max(v):.2f}" for v in spans.values()) + " |")
    out["table"] = lines
    print("\n".join(lines))
    write_json("crash_loss", out)
    within = all(max(loss.values()) <= out[name]["bound_s"] for name in ("default", "frugal")
                 for loss in out[name]["losses_s"])
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
