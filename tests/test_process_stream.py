"""The gpu{i}.processes bookkeeping: new samples only, NaN where the driver said nothing,
idle rows, and identity markers for new, gone and reused pids (docs/processes.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.acquirers.process_identity import IDENTITY_KEYS
from wattlab.acquisition.acquirers.process_stream import (
    LAST_SAMPLE_AFTER_EXIT_NS,
    ProcessStream,
)
from wattlab.samples import Marker

OFFSET_NS = 10**18  # unix ns - host ns


def stream(ticks: dict[int, int | None]) -> ProcessStream:
    return ProcessStream(
        0, "gpu0.processes", last_seen_us=1_000,
        identify=lambda pid: {"start_ticks": ticks.get(pid), "comm": f"p{pid}"},
        start_ticks=lambda pid: ticks.get(pid),
        to_host_ns=lambda us: us * 1000 - OFFSET_NS)


def split(readings):
    chunks = [r for r in readings if isinstance(r, Chunk)]
    markers = [r for r in readings if isinstance(r, Marker)]
    return chunks, markers


@pytest.mark.fast
def test_rows_are_the_drivers_samples_with_memory_and_nan_where_not_said():
    s = stream({7: 100, 8: 200})
    chunks, markers = split(s.update(
        [(7, 2_000, 40, 9, 0, 0), (8, 2_000, 25, 6, 0, 0), (7, 500, 99, 99, 0, 0)],
        {7: 3e9}, read_us=2_100, read_ns=2_100_000 - OFFSET_NS))
    (chunk,) = chunks
    assert chunk.values.shape == (2, 6)  # the sample not newer than last seen is dropped
    assert chunk.values[0].tolist() == [7, 40, 9, 0, 0, 3e9]
    assert chunk.values[1, 0] == 8 and math.isnan(chunk.values[1, 5])  # no memory said: NaN
    assert chunk.t_raw.tolist() == [2_000, 2_000]
    assert chunk.t_host_ns.tolist() == [2_000_000 - OFFSET_NS] * 2
    assert [m.payload["pid"] for m in markers] == [7, 8]
    assert set(markers[0].payload) == {"gpu", "pid", *IDENTITY_KEYS}
    assert markers[0].payload["comm"] == "p7" and markers[0].payload["local_pid"] is None


@pytest.mark.fast
def test_a_second_read_repeats_no_sample_and_marks_no_process_again():
    s = stream({7: 100})
    s.update([(7, 2_000, 40, 9, 0, 0)], {7: 1.0}, 2_100, 0)
    chunks, markers = split(s.update([(7, 2_000, 40, 9, 0, 0), (7, 2_166, 41, 9, 0, 0)],
                                     {7: 1.0}, 2_300, 1))
    assert chunks[0].t_raw.tolist() == [2_166] and markers == []


@pytest.mark.fast
def test_a_process_holding_memory_without_activity_gets_a_zero_row_at_the_read():
    s = stream({7: 100, 9: 300})
    chunks, markers = split(s.update([(7, 2_000, 40, 9, 0, 0)], {7: 1.0, 9: 5e8},
                                     read_us=2_100, read_ns=555))
    idle = chunks[0].values[chunks[0].values[:, 0] == 9]
    assert idle.tolist() == [[9, 0, 0, 0, 0, 5e8]]
    assert chunks[0].t_host_ns[chunks[0].values[:, 0] == 9].tolist() == [555]
    assert [m.payload["pid"] for m in markers] == [7, 9]


@pytest.mark.fast
def test_a_read_without_utilisation_marks_who_came_and_writes_no_row():
    # the reader skips the utilisation call while one process is alone: a zero row would
    # say the process did nothing, when it had the whole device
    s = stream({7: 100})
    chunks, markers = split(s.update(None, {7: 1.0}, read_us=2_100, read_ns=555))
    assert chunks == [] and [m.payload["pid"] for m in markers] == [7]
    assert s.last_seen_us == 1_000  # nothing read: the next read asks from the same stamp
    chunks, markers = split(s.update([], {7: 1.0}, read_us=2_300, read_ns=777))
    assert chunks[0].values.tolist() == [[7, 0, 0, 0, 0, 1.0]] and markers == []


@pytest.mark.fast
def test_a_process_leaving_the_gpu_is_marked_once():
    s = stream({7: 100})
    s.update([(7, 2_000, 40, 9, 0, 0)], {7: 1.0}, 2_100, 10)
    _, markers = split(s.update([], {}, 2_300, 20))
    assert [(m.name, m.payload, m.t_host_ns) for m in markers] == [
        ("process-exit", {"gpu": 0, "pid": 7, "start_ticks": 100}, 20)]
    assert split(s.update([], {}, 2_500, 30)) == ([], [])


@pytest.mark.fast
def test_a_reused_pid_is_an_exit_then_a_new_process_before_its_rows():
    ticks = {7: 100}
    s = stream(ticks)
    s.update([(7, 2_000, 40, 9, 0, 0)], {7: 1.0}, 2_100, 10)
    ticks[7] = 999  # the pid now belongs to another process
    chunks, markers = split(s.update([(7, 3_000, 5, 1, 0, 0)], {7: 2.0}, 3_100, 40))
    assert [(m.name, m.payload["start_ticks"]) for m in markers] == [("process-exit", 100),
                                                                     ("process", 999)]
    assert markers[1].t_host_ns <= int(chunks[0].t_host_ns[0])


@pytest.mark.fast
def test_a_process_unknown_to_proc_is_never_taken_for_a_reused_pid():
    s = stream({})  # start_ticks None: not visible from here
    s.update([(7, 2_000, 40, 9, 0, 0)], {7: 1.0}, 2_100, 10)
    assert split(s.update([(7, 2_200, 40, 9, 0, 0)], {7: 1.0}, 2_300, 20))[1] == []
    assert np.isfinite(split(s.update([], {7: 1.0}, 2_500, 30))[0][0].values).all()


@pytest.mark.fast
def test_a_sample_stamped_just_after_a_process_left_is_its_row_not_a_new_process():
    """The driver's sample covers the period before its stamp: the one of a context's last
    work can come after the read that no longer listed it (the simulated GPU read every
    0.15 s marked such a process gone, new, then gone again)."""
    s = stream({7: 100, 8: 200})
    s.update([(7, 2_000, 40, 9, 0, 0), (8, 2_000, 30, 5, 0, 0)], {7: 1.0, 8: 1.0}, 2_100,
             2_100_000 - OFFSET_NS)
    _, markers = split(s.update([(8, 2_150, 30, 5, 0, 0)], {8: 1.0}, 2_200,
                                2_200_000 - OFFSET_NS))
    assert [(m.name, m.payload["pid"]) for m in markers] == [("process-exit", 7)]
    chunks, markers = split(s.update([(7, 2_240, 35, 8, 0, 0), (8, 2_300, 30, 5, 0, 0)],
                                     {8: 1.0}, 2_350, 2_350_000 - OFFSET_NS))
    assert markers == []  # not "process" again, so no second exit either
    assert chunks[0].values[:, 0].tolist() == [7, 8] and math.isnan(chunks[0].values[0, 5])
    assert split(s.update([], {8: 1.0}, 2_500, 2_500_000 - OFFSET_NS))[1] == []


@pytest.mark.fast
def test_a_pid_seen_again_after_the_driver_period_or_with_another_start_is_new():
    late_us = 2_100 + LAST_SAMPLE_AFTER_EXIT_NS // 1000 + 10
    for ticks_after, stamp_us, running in ((100, late_us, {}), (999, 2_150, {}),
                                           (100, 2_150, {7: 1.0})):
        ticks = {7: 100}
        s = stream(ticks)
        s.update([(7, 2_000, 40, 9, 0, 0)], {7: 1.0}, 2_050, 2_050_000 - OFFSET_NS)
        s.update([], {}, 2_100, 2_100_000 - OFFSET_NS)  # gone
        ticks[7] = ticks_after
        _, markers = split(s.update([(7, stamp_us, 5, 1, 0, 0)], running, stamp_us + 50,
                                    (stamp_us + 50) * 1000 - OFFSET_NS))
        assert [(m.name, m.payload["start_ticks"]) for m in markers] == [
            ("process", ticks_after)], (ticks_after, stamp_us, running)
