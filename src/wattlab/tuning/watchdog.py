"""A small process that restores the GPU's settings if the tuner dies without doing so.

Why: ``finally`` and signal handlers cover an error, Ctrl-C and SIGTERM, but not SIGKILL,
the OOM killer or a segfault of the tuner itself. The watchdog is started (in its own
session, so a terminal's Ctrl-C does not reach it) with the originals before the first
change, and holds a pipe from the tuner: the tuner writes ``done`` once it has restored;
end-of-file without ``done`` means the tuner died, and the watchdog restores through its
own NVML handle. With ``simulate`` (tests) the GPU is simulated in this process, so the
restore runs against a fresh simulated GPU and its calls are logged to ``log``: what is
tested is that a dead tuner is noticed and the restore path runs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import IO, Any

DONE = b"done\n"


def start(originals: dict[str, Any], *, simulate: bool, log: str | None) -> subprocess.Popen[bytes]:
    """Launch the watchdog; keep the returned process and call ``release`` after restoring."""
    spec = json.dumps({**originals, "simulate": simulate, "log": log})
    proc = subprocess.Popen([sys.executable, "-m", "wattlab.tuning.watchdog", spec],
                            stdin=subprocess.PIPE, start_new_session=True)
    return proc


def release(proc: subprocess.Popen[bytes]) -> None:
    """The tuner restored everything itself: the watchdog exits without touching the GPU."""
    stdin: IO[bytes] | None = proc.stdin
    try:
        if stdin is not None:
            stdin.write(DONE)
            stdin.close()
    except OSError:
        pass  # it died: nothing is left to tell
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _restore(spec: dict[str, Any]) -> dict[str, Any]:
    from wattlab.acquisition.experiments import open_driver
    from wattlab.tuning.guards import KnobGuards

    driver, _, _ = open_driver(bool(spec["simulate"]), int(spec["gpu"]))
    try:
        guards = KnobGuards(driver, int(spec["gpu"]), list(spec["knobs"]))
        for knob, guard in guards.guards.items():
            guard.changed = True  # we cannot know which were changed: restore them all
            if knob == "power_limit":
                guard.original_power_limit_w = float(spec["power_limit_w"])
        return guards.restore()
    finally:
        driver.close()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tuner handles these; we outlive it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = json.loads(argv[0])
    seen = sys.stdin.buffer.read()  # returns at end-of-file: the tuner closed it or died
    if seen.endswith(DONE):
        return 0
    restored = _restore(spec)
    line = json.dumps({"restored": restored, "unix_s": time.time()})
    print(f"wattlab tune watchdog: the tuner died; restored {line}", file=sys.stderr)
    if spec.get("log"):
        with open(spec["log"], "a") as fh:
            fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
