"""Rows that cannot be right are flagged at ingest and counted (issue 36, item 4)."""

from __future__ import annotations

import numpy as np
import pytest

import wattlab
from tests.conftest import descriptor
from wattlab.samples import SampleBatch, SampleFlag
from wattlab.sync.recorder.admission.ingest_flags import MAX_AHEAD_NS, flag_suspect_rows

NOW_NS = 10**12
BAD_TIME = int(SampleFlag.TIME_INVALID)
BAD_VALUE = int(SampleFlag.NOT_FINITE)


@pytest.mark.fast
def test_backwards_out_of_range_and_non_finite_rows_are_flagged_and_counted():
    t = np.array([100, 50, 60, -5, 70, NOW_NS + MAX_AHEAD_NS + 1, 80], dtype=np.int64)
    values = np.ones((7, 2))
    values[2, 1] = np.nan
    values[4, 0] = np.inf
    given = np.zeros(7, dtype=np.uint8)
    given[4] = SampleFlag.NO_DATA  # the source says so already: not counted again
    counts: dict[str, int] = {}
    flags = flag_suspect_rows(t, values, given, last_t_ns=90, now_ns=NOW_NS, counts=counts)
    assert flags.tolist() == [0, BAD_TIME, BAD_VALUE, BAD_TIME, SampleFlag.NO_DATA,
                              BAD_TIME, 0]
    assert counts == {"time_backwards": 1, "time_out_of_range": 2, "not_finite": 1}
    assert given.tolist() == [0, 0, 0, 0, SampleFlag.NO_DATA, 0, 0]  # the input is not written


@pytest.mark.fast
def test_the_row_after_a_wild_time_is_judged_by_its_own_time():
    t = np.array([2**62 - 1, 200], dtype=np.int64)
    counts: dict[str, int] = {}
    flags = flag_suspect_rows(t, np.ones((2, 1)), None, last_t_ns=100, now_ns=NOW_NS,
                              counts=counts)
    assert flags.tolist() == [BAD_TIME, 0]
    assert counts == {"time_out_of_range": 1}


@pytest.mark.fast
def test_a_clean_batch_keeps_its_flags_array():
    given = np.full(3, SampleFlag.REPEAT, dtype=np.uint8)
    out = flag_suspect_rows(np.arange(3, dtype=np.int64), np.ones((3, 1)), given,
                            last_t_ns=-1, now_ns=NOW_NS, counts={})
    assert out is given


@pytest.mark.system
def test_the_recorder_flags_suspect_rows_and_reports_them(recorder):
    rec = recorder(flush_interval_s=0.05)
    pub = rec.publisher(descriptor("gpu0"))
    t = np.array([3_000, 2_000, 4_000, -(2**62) + 1], dtype=np.int64)
    values = np.array([[1, 1], [2, np.nan], [3, 3], [4, 4]], dtype="<f4")
    pub.send_batch(SampleBatch("gpu0", 0, t, values))
    pub.end("gpu0", 0)
    pub.close()
    reply = rec.stop()
    assert reply["sources"]["gpu0"]["flagged"] == {"time_backwards": 1,
                                                   "time_out_of_range": 1, "not_finite": 1}
    with wattlab.open(rec.path) as run:
        flags = run.source("gpu0").flags.tolist()
    assert flags == [0, BAD_TIME | BAD_VALUE, 0, BAD_TIME]
