"""kill -9 of a whole `wattlab record` session at random instants, then `wattlab repair`.

Each trial records two simulated GPUs whose readers send every 0.1 s, so the recorder is
flushing much of the time, and kills the session's process group (CLI, readers, recorder)
at a random instant after the run file appears. What `wattlab info` read before the
repair must still be in the file after it, row for row, and plain h5py (and h5dump where
installed) must open the file.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import wattlab
from wattlab.cli import main
from wattlab.errors import WattlabError
from wattlab.runfile.crash_flags import crash_flags
from wattlab.runfile.repair import repair_run

TRIALS = 20
AT_ONCE = 4  # sessions recording side by side: they mostly wait, so 2 cores keep up
KILL_WITHIN_S = 2.5  # after the file appears: spans its creation, SWMR start and flushes
SEED = 23


@dataclass
class Trial:
    path: Path
    delay_s: float
    seen: dict[str, Any] | None = None  # `info --json` before the repair (None: unreadable)
    rows: dict[str, tuple[np.ndarray, np.ndarray]] | None = None  # time, values per source
    flags: int = 0
    repair_status: int = -1


def record_and_kill(trial: Trial) -> None:
    """Start a session in its own process group; SIGKILL the whole group at the instant."""
    session = subprocess.Popen(
        [sys.executable, "-m", "wattlab.cli", "record", "--simulate", "--simulated-gpus", "2",
         "--nvml-intervals", "drain=0.1,emit=0.1,state=0.1", "--duration", "60", "--no-live",
         "-o", str(trial.path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not trial.path.exists():
            assert time.monotonic() < deadline, "the session never created its run file"
            assert session.poll() is None, "the session ended before creating its run file"
            time.sleep(0.01)
        time.sleep(trial.delay_s)
    finally:
        os.killpg(session.pid, signal.SIGKILL)
        session.wait(10)


def info_json(path: Path) -> dict[str, Any] | None:
    """What `wattlab info --json` says, or None where it cannot read the file."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main(["info", "--json", str(path)])
    return json.loads(out.getvalue()) if status == 0 else None


def repair(path: Path) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(["repair", str(path)])


@pytest.fixture(scope="module")
def trials(tmp_path_factory) -> list[Trial]:
    folder = tmp_path_factory.mktemp("kill9")
    delays = np.random.default_rng(SEED).uniform(0.0, KILL_WITHIN_S, TRIALS)
    runs = [Trial(folder / f"run{i}.h5", float(d)) for i, d in enumerate(delays)]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        list(pool.map(record_and_kill, runs))
    for trial in runs:
        trial.flags = crash_flags(str(trial.path)) if trial.path.stat().st_size else 0
        trial.seen = info_json(trial.path)
        if trial.seen is not None:
            with wattlab.open(str(trial.path)) as run:
                trial.rows = {sid: (v.time_ns, v.values) for sid, v in run.sources.items()}
        trial.repair_status = repair(trial.path)
    return runs


@pytest.mark.system
def test_every_killed_session_repairs_and_keeps_every_row_info_saw(trials):
    readable = [t for t in trials if t.seen is not None]
    # a kill in the first milliseconds may leave a file HDF5 never finished creating;
    # nearly every trial must have something for info to read
    assert len(readable) >= TRIALS - 2, [(t.delay_s, t.path.stat().st_size) for t in trials]
    assert sum(1 for t in readable if t.flags) >= TRIALS - 2, "the kills found files closed"
    assert sum(1 for t in readable if t.rows and any(len(r[0]) for r in t.rows.values())) \
        >= TRIALS // 2, "too few trials were killed while rows were being written"
    for trial in readable:
        assert trial.seen is not None and trial.rows is not None
        assert trial.repair_status == 0, trial
        assert crash_flags(str(trial.path)) == 0
        with h5py.File(trial.path, "r") as f:  # plain h5py: no SWMR, no wattlab
            assert set(f["sources"]) == set(trial.rows)
            for sid, (time_ns, values) in trial.rows.items():
                group = f["sources"][sid]
                assert group["time"].shape[0] >= trial.seen["sources"][sid]["rows"]
                assert len(time_ns) == trial.seen["sources"][sid]["rows"]
                np.testing.assert_array_equal(group["time"][: len(time_ns)], time_ns)
                np.testing.assert_array_equal(group["values"][: len(values)], values)
                lengths = {group[n].shape[0] for n in ("time", "time_raw", "values", "flags")}
                assert len(lengths) == 1, (sid, lengths)  # no torn tail left
            record = json.loads(f.attrs["repair_json"])
            assert record["crash_flags"] == trial.flags
    for trial in trials:
        if trial.seen is None:  # never an unreadable file called repaired
            assert trial.repair_status == 2


@pytest.mark.system
@pytest.mark.skipif(shutil.which("h5dump") is None,
                    reason="h5dump (Debian package hdf5-tools) is not installed; plain h5py "
                           "is checked in the test above")
def test_h5dump_reads_every_repaired_file(trials):
    for trial in trials:
        if trial.seen is None:
            continue
        result = subprocess.run(["h5dump", "-H", str(trial.path)], capture_output=True,
                                text=True, check=False)
        assert result.returncode == 0, (trial.path, result.stderr[-500:])
        assert "/sources" in result.stdout or 'GROUP "sources"' in result.stdout


@pytest.mark.fast
def test_repair_refuses_a_file_that_is_not_hdf5(tmp_path):
    path = tmp_path / "junk.h5"
    path.write_bytes(b"not hdf5 at all")
    with pytest.raises(WattlabError, match="not a readable HDF5 file"):
        repair_run(str(path))
