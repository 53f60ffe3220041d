"""The recording's own CPU in every run file (issue 39): taken, kept, shown; old files too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import h5py
import pytest

import wattlab
from wattlab.acquisition.session.process_cpu import CpuWindow, process_cpu_s
from wattlab.runfile import schema
from wattlab.runfile.processes.recording_cpu import (
    ProcessCpu,
    RecordingCpu,
    read_recording_cpu,
    recording_cpu_line,
    stop_attrs,
)

WATTLAB = [sys.executable, "-m", "wattlab.cli"]
RECORD = RecordingCpu(0, 10 * 10**9, {
    "session": ProcessCpu(11, 1.0, 0.5, 1.01, 0.5),
    "gpu0": ProcessCpu(12, 2.0, 0.1, 2.03, 0.12),
    "recorder": ProcessCpu(13, 0.5, 0.5, None, None),
})


@pytest.mark.fast
def test_record_reads_back_and_shows_one_line_with_each_process() -> None:
    attrs = {schema.RECORDING_CPU_JSON: RECORD.to_json()}
    assert read_recording_cpu(attrs) == RECORD
    assert RECORD.percent_of_core("gpu0") == pytest.approx(0.5)
    line = recording_cpu_line(attrs)
    assert line == ("recording CPU: 0.600 % of one core over 10.0 s (user + system; "
                    "session 0.100, gpu0 0.500, recorder ended)")


@pytest.mark.fast
def test_a_file_without_the_record_shows_nothing() -> None:
    assert read_recording_cpu({}) is None
    assert recording_cpu_line({schema.CREATED: "2026-11-01"}) is None


@pytest.mark.fast
def test_only_a_local_stop_with_a_record_that_reads_back_reaches_the_file() -> None:
    text = RECORD.to_json()
    assert stop_attrs({"recording_cpu": text}, None) == {schema.RECORDING_CPU_JSON: text}
    assert stop_attrs({"recording_cpu": text}, "node7") == {}  # a remote agent
    assert stop_attrs({"recording_cpu": "{not json"}, None) == {}
    assert stop_attrs({"recording_cpu": json.dumps({"processes": {}})}, None) == {}
    assert stop_attrs({}, None) == {}


@pytest.mark.fast
def test_process_clocks_count_this_process_and_miss_an_ended_one() -> None:
    window = CpuWindow()
    assert window.end() is None  # never started: nothing to say
    window.start({"session": os.getpid(), "gone": 2**22 + 12345, "unknown": None})
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    record = window.end()
    assert record is not None and set(record.processes) == {"session"}
    used = record.processes["session"].used_s
    assert used is not None and used >= 0.03  # 10 ms ticks
    assert process_cpu_s(2**22 + 12345) is None


@pytest.mark.system
@pytest.mark.parametrize("processes", [[], ["--source-processes"]])
def test_a_recording_keeps_its_tree_cpu_and_info_shows_it(tmp_path, processes) -> None:
    out = tmp_path / "run.h5"
    result = subprocess.run([*WATTLAB, "record", "--simulate", "--duration", "2", "-o",
                             str(out), *processes], capture_output=True, text=True,
                            timeout=90, check=False)
    assert result.returncode == 0, result.stderr
    with wattlab.open(str(out)) as run:
        record = read_recording_cpu(run.attrs)
    assert record is not None
    roles = {"session", "recorder"} | ({"gpu0"} if processes else set())
    assert set(record.processes) == roles
    assert 1.0 < record.window_s < 4.0
    for role in roles:
        used = record.processes[role].used_s
        assert used is not None and used >= 0
    info = subprocess.run([*WATTLAB, "info", str(out)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert info.returncode == 0, info.stderr
    assert [ln for ln in info.stdout.splitlines() if ln.startswith("recording CPU: ")]
    with h5py.File(out, "r+") as f:  # a file written before the record existed
        del f.attrs[schema.RECORDING_CPU_JSON]
    info = subprocess.run([*WATTLAB, "info", str(out)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert info.returncode == 0 and "recording CPU" not in info.stdout
