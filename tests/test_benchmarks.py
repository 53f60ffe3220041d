"""The benchmark suite runs (quick mode), and what each benchmark reports is what happened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOALS_MISSED = 3  # bench/common.py: a benchmark ran, wrote its result and missed a goal


def assert_soak_reports_its_loss(soak: dict[str, Any], run_all_exit: int, said: str) -> None:
    """Issue 9: CI runs 15 s of the soak. Its goal, every PowerSensor3 frame in the file and
    nothing in /gaps, is the benchmark's (exit GOALS_MISSED, BENCHMARKS.md); what holds
    under any load is that loss is reported exactly when it happened: frames the emulator
    sent or skipped (the device's clock ran on) that are not in the file, against gap rows
    that count frames or say they could not. (Not the counts equal: across a hole over the
    10-bit clock's 1024 µs wrap the count is the host's estimate, late by the read's own
    delay: 155002 reported for 133844 lost under two CPU burners.)
    """
    assert soak["seconds"] == 15
    device_frames = soak["ps3_frames_sent"] + soak["ps3_frames_skipped_by_emulator"]
    assert device_frames > 15 * 20_000 * 0.5  # the 20 kHz stream really ran
    happened = device_frames - soak["ps3_rows"]
    reported = soak["ps3_lost_reported"] > 0 or soak["ps3_uncounted_gaps"] > 0
    assert reported == (happened > 0), (happened, soak["gaps"])
    assert all(g["reason"] for g in soak["gaps"])
    # the session's status (issue 36): 1 exactly when the file holds a gap row, whatever
    # lost the rows (a failed source, frames a loaded machine did not read in time), never
    # 0 after a loss; time never runs backwards, memory stays bounded
    assert soak["exit_status"] == (1 if soak["gaps"] else 0), (soak["gaps"],
                                                               soak["stderr_tail"])
    assert soak["time_backwards"] == {}
    assert {"recorder", "session", "source gpu0", "source ps3", "source wall"} <= set(
        soak["processes"])
    for role, p in soak["processes"].items():
        assert p["rss_growth_mb"] < 25, (role, p["rss_curve_s_mb"])
    if soak["ps3_lost"] != 0 or soak["gaps"] or soak["exit_status"] != 0:  # said, not hidden
        assert run_all_exit == GOALS_MISSED, said


@pytest.mark.bench
@pytest.mark.timeout(600)
def test_run_all_quick_regenerates_the_summary(tmp_path):
    # results go to tmp_path, so a developer's full results in bench/results stay
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all"), "--quick"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
                            env={**os.environ, "WATTLAB_BENCH_RESULTS": str(tmp_path)})
    # every benchmark ran and wrote its result; a real-time goal (the soak's zero loss) may
    # be missed on a loaded machine (GOALS_MISSED): the goals are the benchmarks' own, their
    # figures in BENCHMARKS.md; a crash fails here
    assert result.returncode in (0, GOALS_MISSED), result.stdout[-3000:] + result.stderr[-3000:]
    rebuilt = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all"), "--table-only"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
                             env={**os.environ, "WATTLAB_BENCH_RESULTS": str(tmp_path)})
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    summary = (tmp_path / "summary.md").read_text()
    for name in ("ingest", "decode", "ps3_stream", "visa", "sync", "analysis_scale", "soak",
                 "many_runs", "prometheus_cost", "slurm_two_nodes"):
        # a CI-sized figure says so in its command, also in a table rebuilt from the JSON
        assert f"| {name} | `python bench/{name}.py --quick` |" in summary
    assert_soak_reports_its_loss(json.loads((tmp_path / "soak.json").read_text()),
                                 result.returncode, result.stdout[-3000:])

@pytest.mark.bench
def test_counter_grid_finds_the_simulated_grid_and_placing_helps(tmp_path):
    # the GPU benchmark that checks counter_ticks' premise, on the simulated GPU's 100 ms grid
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "counter_grid.py"),
                             "--simulate", "--seconds", "3", "--late-ms", "20"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "WATTLAB_BENCH_RESULTS": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "counter_grid.json").read_text())
    # the simulator's grid is exactly 100 ms on the clock the reads are timed by; the fit
    # may be off by what the reads leave open (each change anywhere between its two reads,
    # a read anywhere inside its call), which a busy machine widens: the bench states it
    grid = data["grid"]
    assert grid["period_bound_ms"] > 0 and abs(grid["period_ms"] - 100.0) <= grid[
        "period_bound_ms"], grid
    # and it is one regular grid: a grid of exactly 100 ms passes through the interval each
    # change was seen in (how far the changes stray from the fit depends on the load)
    assert grid["nominal_slack_ms"] >= 0, grid
    # a pinned phase is the middle of the arc the reads allow (no read falls inside it, at
    # most half a period wide), so within 25 ms of the grid, plus how far a read's time may
    # be off (anywhere in its call: long calls where the reader was preempted) and the
    # room the nominal grid had
    assert data["pinned"] >= 1
    for off, half_call in zip(data["pinned_phase_off_ms"], data["pinned_worst_half_call_ms"],
                              strict=True):
        assert abs(off) <= 25.0 + half_call + grid["nominal_slack_ms"], (off, half_call, grid)
    short = data["window_errors"]["0.1s"]
    assert short["placed_p99_j"] <= short["as_read_p99_j"]


def loaded_soak(exit_status: int, gaps: list[dict[str, Any]]) -> dict[str, Any]:
    """A 15 s soak as a loaded machine leaves it: 1,000 frames the host did not read in
    time, which the recorder's PowerSensor3 source saw as a jump of the device's clock."""
    frames = 15 * 20_000
    procs = {role: {"rss_growth_mb": 1.0, "rss_curve_s_mb": []} for role in (
        "recorder", "session", "source gpu0", "source ps3", "source wall")}
    return {"seconds": 15, "ps3_frames_sent": frames - 1000,
            "ps3_frames_skipped_by_emulator": 1000, "ps3_rows": frames - 1000,
            "ps3_lost": 0, "ps3_lost_reported": sum(g["samples_lost"] for g in gaps),
            "ps3_uncounted_gaps": 0, "gaps": gaps, "exit_status": exit_status,
            "time_backwards": {}, "processes": procs, "stderr_tail": ""}


FRAMES_LOST = {"source": "ps3", "samples_lost": 1000,
               "reason": "device time jumped 50.00 ms (1000 frames lost)"}


@pytest.mark.fast
def test_a_soak_that_lost_frames_under_load_and_exited_1_passes():
    # seen in a loaded fresh-clone run (issue 34): frames lost, reported by a gap row, and
    # the session exited 1 as issue 36 asks; "1 only where a source failed" failed it
    assert_soak_reports_its_loss(loaded_soak(1, [FRAMES_LOST]), GOALS_MISSED, "")


@pytest.mark.fast
@pytest.mark.parametrize(("exit_status", "gaps"), [(0, [FRAMES_LOST]), (1, [])],
                         ids=["exit-0-after-a-loss", "exit-1-with-nothing-lost"])
def test_a_soak_whose_exit_status_hides_or_invents_a_loss_fails(exit_status, gaps):
    soak = loaded_soak(exit_status, gaps)
    if not gaps:  # nothing lost: every frame the device made is in the file
        soak.update(ps3_frames_skipped_by_emulator=0, ps3_frames_sent=soak["ps3_rows"])
    with pytest.raises(AssertionError, match="exit_status"):
        assert_soak_reports_its_loss(soak, GOALS_MISSED, "")
