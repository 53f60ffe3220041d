"""`wattlab qualify`'s analysis on hand-built run files whose truth is known (fast tier)."""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.data_files import DATA
from wattlab.analysis.calibration import calibrate
from wattlab.analysis.qualify import (
    LEVELS,
    MLPERF_WINDOW_S,
    Procedure,
    check_windows,
    olympic_mean,
    qualify,
)
from wattlab.analysis.qualify.levels import marked_phases
from wattlab.analysis.qualify.verdict import scatter_pm_pct
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.runfile import MarkerRow, Run, schema
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor

LEVEL_W = {"idle": 100.0, "load1": 300.0, "load2": 600.0}
LEVEL_S = 8.0
PROC = Procedure(window_s=1.0, settle_s=0.5)
REF, NVML, WALL = "riser:board_power_w", "gpu0.power:average_power_w", "wall:wall_power_w"


def _meter(sid: str, channel: str, **config: object) -> SourceDescriptor:
    return SourceDescriptor(sid, "meter", "meter", (Channel(channel, "W", "power"),),
                            config=dict(config))


def write_levels_run(path: Path, *, gain: float = 1.03, levels: tuple[str, ...] = tuple(LEVEL_W),
                     start_unix_ns: int = 1, wired: bool = True, riser_lost: float = 0.0,
                     level_s: float = LEVEL_S, lost_rows: int = 0, counter: bool = False,
                     host: str = "test", uuid: str = "") -> Path:
    """Three held levels with a ripple; NVML reads gain × truth, the wall adds 150 W.

    ``riser_lost``: the share of the riser's rows lost in holes of 5-50 ms (a USB riser on
    a busy host). ``counter``: the GPU's energy counter too (``gpu0.energy``, the truth's
    integral read every 0.1 s, as ``qualify --gpu`` without a meter reads it).
    """
    writer = RunFileWriter(str(path), {schema.HOST: host,
                                       schema.SESSION_START_UNIX_NS: start_unix_ns,
                                       schema.CREATED: "test"}, 0)
    riser = {"feeds_gpu": 0, "board_power_channel": "board_power_w",
             "power_channel": "board_power_w"} if wired else {}
    writer.add_source(_meter("riser", "board_power_w", **riser))
    writer.add_source(_meter("wall", "wall_power_w", **(
        {"rails": {"wall": {"input": "element 1", "channels": ["wall_power_w"]}}} if wired
        else {})))
    writer.add_source(SourceDescriptor("gpu0.power", "nvml", "Simulated H100",
                                       (Channel("average_power_w", "W", "average"),),
                                       config={"driver_version": "1", "uuid": uuid}))
    t_s = np.arange(0.0, level_s * len(levels) + 1.0, 1e-3)
    truth = np.full(t_s.size, LEVEL_W["idle"])
    markers = []
    for k, name in enumerate(levels):
        a, b = 0.5 + k * level_s, 0.5 + (k + 1) * level_s
        truth[(t_s >= a) & (t_s < b)] = LEVEL_W[name]
        markers += [Marker(round(a * 1e9), name, "begin", "load"),
                    Marker(round(b * 1e9), name, "end", "load")]
    truth += 5.0 * np.sin(2 * np.pi * 0.7 * t_s)
    t_ns = np.round(t_s * 1e9).astype(np.int64)
    flags = np.zeros(t_ns.size, np.uint8)
    kept = np.ones(t_ns.size, bool)
    rng = np.random.default_rng(5)
    while 1.0 - kept.mean() < riser_lost:
        start = int(rng.integers(0, t_ns.size))
        kept[start:start + int(rng.integers(5, 50))] = False
    writer.append("riser", t_ns[kept], t_ns[kept], truth[kept].reshape(-1, 1), flags[kept])
    writer.append("wall", t_ns, t_ns, (truth + 150.0).reshape(-1, 1), flags)
    poll = slice(None, None, 20)
    writer.append("gpu0.power", t_ns[poll], t_ns[poll], (gain * truth[poll]).reshape(-1, 1),
                  flags[poll])
    if counter:
        writer.add_source(SourceDescriptor("gpu0.energy", "nvml", "Simulated H100",
                                           (Channel("energy_j", "J", "total energy"),),
                                           config={"driver_version": "1"}))
        reads = slice(None, None, 100)
        joules = np.concatenate(([0.0], np.cumsum(truth[1:] * np.diff(t_s))))
        writer.append("gpu0.energy", t_ns[reads], t_ns[reads],
                      (1e5 + joules[reads]).reshape(-1, 1), flags[reads])
    writer.add_markers(markers)
    if lost_rows:
        writer.add_gaps([Gap("riser", "frames lost before they reached the host",
                             samples_lost=lost_rows)])
    writer.close()
    return path


@pytest.mark.fast
def test_olympic_mean_drops_the_highest_and_lowest() -> None:
    assert olympic_mean([10.0, 1.0, 3.0, 2.0, 100.0]) == pytest.approx(5.0)
    assert np.isnan(olympic_mean([1.0, 2.0, float("nan"), 4.0, 5.0]))
    with pytest.raises(UsageError, match="takes 5 window means, got 4"):
        olympic_mean([1.0, 2.0, 3.0, 4.0])


@pytest.mark.fast
def test_windows_must_be_five_and_apart() -> None:
    apart = [(float(k), k + 1.0) for k in range(5)]
    check_windows("idle", apart)
    with pytest.raises(UsageError, match="4 window"):
        check_windows("idle", apart[:4])
    with pytest.raises(UsageError, match="overlap"):
        check_windows("load1", [*apart[:4], (3.5, 4.5)])


@pytest.mark.fast
def test_nvml_with_a_3_pct_gain_scores_3_pct(tmp_path: Path) -> None:
    with Run(str(write_levels_run(tmp_path / "r.h5"))) as run:
        verdicts = qualify(run, REF, [NVML], PROC)
        strict = qualify(run, REF, [NVML], Procedure(1.0, max_pct=2.0, settle_s=0.5))
    v = verdicts[0]
    assert v.x_pct == pytest.approx(3.0, abs=0.01)
    assert v.passed and v.valid and not strict[0].passed
    assert [lv["level"] for lv in v.levels] == ["idle", "load1", "load2"]
    assert all(len(lv["windows_s"]) == 5 for lv in v.levels)
    assert [f["window_s"] for f in v.fine] == [0.1, 1.0, 10.0]
    assert v.fine[0]["median_pct"] == pytest.approx(3.0, abs=0.05)
    assert not v.invalid_windows


@pytest.mark.fast
def test_a_riser_losing_a_third_of_its_rows_still_scores_and_says_so(tmp_path: Path) -> None:
    with Run(str(write_levels_run(tmp_path / "r.h5", riser_lost=0.35))) as run:
        v = qualify(run, REF, [NVML], PROC)[0]
    assert v.x_pct == pytest.approx(3.0, abs=0.1)
    assert v.passed and not v.valid
    assert v.invalid_windows[0].startswith("riser idle w1: coverage")


@pytest.mark.fast
def test_wall_against_board_and_the_reference_itself_are_refused(tmp_path: Path) -> None:
    with Run(str(write_levels_run(tmp_path / "r.h5"))) as run:
        wall, itself = qualify(run, REF, [WALL, REF], PROC)
    assert wall.refused and "rail wall" in wall.refused and "gpu 0 board" in wall.refused
    assert itself.refused == "it is the reference itself"


@pytest.mark.fast
def test_without_wiring_the_user_says_what_a_meter_measures(tmp_path: Path) -> None:
    with Run(str(write_levels_run(tmp_path / "r.h5", wired=False))) as run:
        unknown = qualify(run, "riser:board_power_w", [NVML], PROC)[0]
        told = qualify(run, "riser:board_power_w", [NVML, WALL],
                       Procedure(1.0, settle_s=0.5, told={"riser": "gpu 0 board",
                                                          "wall": "rail wall"}))
    assert unknown.refused and "--measures riser=WHAT" in unknown.refused
    assert told[0].passed and told[1].refused


@pytest.mark.fast
def test_a_missing_level_or_a_short_one_is_refused(tmp_path: Path) -> None:
    with Run(str(write_levels_run(tmp_path / "r.h5", levels=("idle", "load1")))) as run, \
            pytest.raises(UsageError, match="no 'load2' phase marked"):
        qualify(run, REF, [NVML], PROC)
    with Run(str(write_levels_run(tmp_path / "s.h5"))) as run, \
            pytest.raises(UsageError, match="5 non-overlapping 2 s windows"):
        qualify(run, REF, [NVML], Procedure(2.0, settle_s=0.5))


# system: over a second (two calibrations fitted: 1.8-4.8 s measured)
@pytest.mark.system
def test_calibrated_nvml_needs_a_calibration_from_another_run(tmp_path: Path) -> None:
    scored = write_levels_run(tmp_path / "scored.h5", start_unix_ns=1)
    write_levels_run(tmp_path / "other.h5", start_unix_ns=2)
    copy = tmp_path / "copy.h5"
    shutil.copy(scored, copy)
    records = {}
    for name in ("scored", "other"):
        with Run(str(tmp_path / f"{name}.h5")) as run:
            records[name] = calibrate(run, REF, NVML)
    records["copy"] = replace(records["scored"], run=str(copy))  # as if fitted on the copy
    with Run(str(scored)) as run:
        for name in ("scored", "copy"):
            with pytest.raises(UsageError, match="refused: it was fitted on"):
                qualify(run, REF, [NVML], PROC, records[name])
        raw, corrected = qualify(run, REF, [NVML], PROC, records["other"])
    assert not raw.corrected and corrected.corrected
    assert corrected.x_pct is not None and corrected.x_pct < 0.5 < raw.x_pct


@pytest.mark.fast
def test_the_command_refuses_a_run_without_a_reference_or_long_enough_levels(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = write_levels_run(tmp_path / "r.h5")
    assert main(["qualify", str(path), "--target", NVML]) == 2
    assert "--accuracy-class" in capsys.readouterr().err
    assert main(["qualify", str(path), "--reference", REF, "--target", NVML,
                 "--accuracy-class", "0.5 %", "--short"]) == 2
    assert "phase 'idle' lasts 8.0 s; 5 non-overlapping 12 s windows" in capsys.readouterr().err


@pytest.mark.fast
def test_the_command_scores_the_short_form_as_json(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = write_levels_run(tmp_path / "r.h5", level_s=63.0)
    assert main(["qualify", str(path), "--reference", REF, "--target", NVML, "--target", WALL,
                 "--accuracy-class", "0.5 % of reading", "--short", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["form"], doc["window_s"], doc["accuracy_class"]) == ("short", 12.0,
                                                                      "0.5 % of reading")
    nvml, wall = doc["targets"]
    assert nvml["x_pct"] == pytest.approx(3.0, abs=0.01) and nvml["passed"]
    assert nvml["levels"][0]["windows_s"][0] == pytest.approx([2.5, 14.5])
    assert wall["refused"]


@pytest.mark.fast
@pytest.mark.parametrize(("lost_rows", "status"), [(0, 0), (40, 1)])
def test_a_recording_that_lost_data_is_scored_but_never_exits_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        lost_rows: int, status: int) -> None:
    from wattlab.commands import qualify as command

    def recorded(args: object, window_s: float, output: str) -> tuple[None, int]:
        # the recording itself (minutes of emulated bench) is bench/qualify.py's; here the
        # run it would leave, with or without a gap row
        write_levels_run(Path(output), level_s=63.0, lost_rows=lost_rows)
        return None, 0

    monkeypatch.setattr(command, "_simulate", recorded)
    out = tmp_path / "q.h5"
    assert main(["qualify", "--simulate", "--short", "-o", str(out), "--reference", REF,
                 "--target", NVML, "--json"]) == status
    captured = capsys.readouterr()
    assert json.loads(captured.out)["targets"][0]["passed"]
    assert ("1 gap(s)" in captured.err) == bool(lost_rows)


TRACES = DATA / "traces"


def _level_marks(edges_ns: list[tuple[int, int | None]]) -> list[MarkerRow]:
    """Begin/end marks of idle, load1, load2 back to back: (host ns, GPU ns) per edge."""
    rows = []
    for i, name in enumerate(LEVELS):
        edges = edges_ns[2 * i:2 * i + 2]
        for kind, (host_ns, gpu_ns) in zip(("begin", "end"), edges, strict=True):
            rows.append(MarkerRow(host_ns, name, kind, "pid1", {}, gpu_ns, 40_000))
    return rows


@pytest.mark.fast
def test_back_to_back_levels_whose_gpu_times_invert_are_taken_in_the_order_sent() -> None:
    # The lent H200 (qualify --gpu 0, twice): idle's end ran 142 us after load1's begin on
    # the GPU's timeline though it was sent first; qualify refused its own recording.
    s = 1_000_000_000
    marks = _level_marks([(4 * s, 4 * s), (67_742_848_664, 67_743_330_010),
                          (67_743_173_273, 67_743_187_953), (130 * s, 130 * s),
                          (130 * s + 1, 130 * s + 1), (193 * s, 193 * s)])
    levels = marked_phases(marks, "r.h5")
    assert [lv.name for lv in levels] == list(LEVELS)
    assert levels[0].t1_s == pytest.approx(67.742848664)
    assert levels[0].t1_s <= levels[1].t0_s
    sent_overlapping = _level_marks([(4 * s, None), (70 * s, None), (67 * s, None),
                                     (130 * s, None), (131 * s, None), (193 * s, None)])
    with pytest.raises(UsageError, match="phases 'idle' and 'load1' overlap"):
        marked_phases(sent_overlapping, "r.h5")


@pytest.mark.fast
def test_the_lent_h200s_own_qualification_runs_score_and_repeat(
        capsys: pytest.CaptureFixture[str]) -> None:
    # `bash bench/device_qualify_37.sh`: two short-form runs of `qualify --gpu 0`, the GPU's
    # energy counter as the reference; both were refused on the GPU (phases overlapping by
    # 142 us on its timeline) before the levels were taken in the order the marks were sent.
    xs = []
    for k in (1, 2):
        trace = TRACES / f"h200_qualify-short-{k}.h5"
        assert main(["qualify", str(trace), "--reference", "gpu0.energy",
                     "--target", "gpu0.power:average_power_w",
                     "--target", "gpu0.power:instant_power_w",
                     "--accuracy-class", "the GPU's own counter", "--short", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [lv["level"] for lv in doc["targets"][0]["levels"]] == list(LEVELS)
        xs.append([t["x_pct"] for t in doc["targets"]])
    for first, second in zip(*xs, strict=True):
        assert abs(first - second) <= 0.2  # issue 37: x repeats within 0.2 points
    assert max(max(x) for x in xs) < 1.0


@pytest.mark.fast
def test_levels_recorded_in_parts_score_as_one_run_does(tmp_path: Path) -> None:
    whole = write_levels_run(tmp_path / "whole.h5")
    idle = write_levels_run(tmp_path / "idle.h5", levels=("idle",), start_unix_ns=2)
    loads = write_levels_run(tmp_path / "loads.h5", levels=("load1", "load2"), start_unix_ns=3)
    with Run(str(whole)) as w, Run(str(idle)) as a, Run(str(loads)) as b:
        (one,) = qualify(w, REF, [NVML], PROC)
        (parts,) = qualify([b, a], REF, [NVML], PROC)
    assert [lv["level"] for lv in parts.levels] == ["load1", "load2", "idle"]
    assert parts.x_pct == pytest.approx(3.0, abs=0.01) and parts.valid
    for lv in parts.levels:
        same = next(x for x in one.levels if x["level"] == lv["level"])
        assert lv["difference_pct"] == pytest.approx(same["difference_pct"], abs=0.01)
    assert len(parts.fine[0]) and parts.fine[0]["windows"] == one.fine[0]["windows"]


@pytest.mark.fast
def test_parts_must_hold_each_level_once_from_one_system(tmp_path: Path) -> None:
    idle = write_levels_run(tmp_path / "idle.h5", levels=("idle",))
    again = write_levels_run(tmp_path / "again.h5", levels=("idle", "load1"))
    loads = write_levels_run(tmp_path / "loads.h5", levels=("load1", "load2"))
    load2 = write_levels_run(tmp_path / "load2.h5", levels=("load2",))
    elsewhere = write_levels_run(tmp_path / "else.h5", levels=("load1", "load2"), host="b")
    swapped = write_levels_run(tmp_path / "swap.h5", levels=("load1", "load2"), uuid="GPU-2")
    cases = [((idle, again, load2), "phase 'idle' is also marked in"),
             ((idle,), "no 'load1', 'load2' phase marked"),
             ((idle, loads, load2), "phase 'load2' is also marked in"),
             ((idle, elsewhere), "recorded on host 'b'"),
             ((idle, swapped), "gpu0.power is device 'GPU-2'"),
             ((idle, loads, idle), "given twice")]
    for paths, message in cases:
        with contextlib.ExitStack() as stack:
            runs = [stack.enter_context(Run(str(p))) for p in paths]
            with pytest.raises(UsageError, match=re.escape(message)):
                qualify(runs, REF, [NVML], PROC)


@pytest.mark.fast
def test_x_carries_the_scatter_of_its_levels_windows() -> None:
    ref = np.array([600.0, 601.0, 599.0, 600.5, 600.0])
    assert scatter_pm_pct(ref, ref * 1.01) == pytest.approx(0.0, abs=1e-9)  # a gain alone
    scattered = ref * 1.01 + np.array([6.0, -4.0, 1.0, 7.0, -3.0])
    rel = 100.0 * (scattered - ref) / ref
    assert scatter_pm_pct(ref, scattered) == pytest.approx(np.std(rel, ddof=1) / np.sqrt(3))
    assert np.isnan(scatter_pm_pct(ref, np.array([600.0, np.nan, 600.0, 600.0, 600.0])))


@pytest.mark.fast
def test_the_lent_h200s_end_to_end_runs_repeat_within_their_stated_scatter(
        capsys: pytest.CaptureFixture[str]) -> None:
    # `bash bench/device_qualify_37.sh 1`, then `... 2` in another device call (2026-11-29):
    # the 1 s average repeats within 0.2 points; the instant view, read at points every
    # 90 ms, moves ~0.4 points between runs, inside what its windows' scatter states.
    docs = []
    for k in (1, 2):
        assert main(["qualify", str(TRACES / f"h200_qualify-e2e-{k}.h5"), "--reference",
                     "gpu0.energy", "--target", "gpu0.power:average_power_w",
                     "--target", "gpu0.power:instant_power_w",
                     "--accuracy-class", "the GPU's own counter", "--short", "--json"]) == 0
        docs.append({t["target"]: t for t in json.loads(capsys.readouterr().out)["targets"]})
    first, second = docs
    average, instant = "gpu0.power:average_power_w", "gpu0.power:instant_power_w"
    assert abs(first[average]["x_pct"] - second[average]["x_pct"]) <= 0.2
    assert abs(first[instant]["x_pct"] - second[instant]["x_pct"]) > 0.2
    for name in (average, instant):
        a, b = first[name], second[name]
        assert abs(a["x_pct"] - b["x_pct"]) <= 2 * np.hypot(a["x_pm_pct"], b["x_pm_pct"])
    assert second[instant]["x_pm_pct"] > 3 * second[average]["x_pm_pct"]


@pytest.mark.fast
def test_a_recording_with_lost_frames_is_scored_and_a_failed_one_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # bench/qualify.py: one 0.75 ms hole in the riser's first second of the calibration
    # run refused the whole qualification ("lost data; not scored", exit 2)
    from wattlab.acquisition.session import SessionResult
    from wattlab.commands.qualify import recording_status

    gap = write_levels_run(tmp_path / "gap.h5", level_s=20.0, lost_rows=1)
    whole = write_levels_run(tmp_path / "whole.h5", level_s=20.0)
    lost = SessionResult(str(gap), None, {}, {}, False)
    assert recording_status(lost) == 1
    assert recording_status(replace(lost, output=str(whole))) == 0
    for failed in (replace(lost, source_errors={"ps3": "port vanished"}),
                   replace(lost, command_exit_code=3), replace(lost, interrupted=True)):
        with pytest.raises(UsageError, match=r"failed .*not scored"):
            recording_status(failed)
    capsys.readouterr()


def _score_full_form(run: int, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The lent H200's full-form run ``run``, its three level files scored as one."""
    parts = [str(DATA / "qualify_full" / f"h200_full_{run}_{level}.h5") for level in LEVELS]
    assert main(["qualify", *parts, "--reference", "gpu0.energy",
                 "--target", "gpu0.power:average_power_w",
                 "--target", "gpu0.power:instant_power_w",
                 "--accuracy-class", "the GPU's own counter", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["form"], doc["runs"]) == ("mlperf", parts)
    return {t["target"]: t for t in doc["targets"]}


@pytest.mark.fast
@pytest.mark.parametrize("run", [1, 2])
def test_the_lent_h200s_full_form_recorded_one_level_a_command_is_scored_whole(
        run: int, capsys: pytest.CaptureFixture[str]) -> None:
    # `bash bench/device_qualify_37.sh full K idle|load1|load2`, three device calls a run
    # (2026-11-29, run 2 in a later session on another lent host): MLPerf's five 60 s
    # windows a level, one level a run file. The three files are scored as one
    # qualification; the instant view's window scatter, which put the short form's repeat
    # to chance (±0.36 points), is several times smaller.
    targets = _score_full_form(run, capsys)
    for target in targets.values():
        assert target["passed"] and target["valid"] and target["refused"] is None
        assert [lv["level"] for lv in target["levels"]] == list(LEVELS)
        for level in target["levels"]:  # window length: each edge pair
            edges = np.array(level["windows_s"])
            assert edges.shape == (5, 2)
            assert np.allclose(edges[:, 1] - edges[:, 0], MLPERF_WINDOW_S)
    average, instant = targets["gpu0.power:average_power_w"], targets["gpu0.power:instant_power_w"]
    assert average["x_pct"] < 0.1 and instant["x_pct"] < 0.3
    assert instant["x_pm_pct"] < 0.1 < instant["x_pct"]


@pytest.mark.fast
def test_the_lent_h200s_full_form_repeats_within_a_fifth_of_a_point(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 37's repeat goal, on the two full-form runs recorded in separate calls: each
    # target's x in run 2 within 0.2 points of run 1, and within twice their combined ±.
    first, second = (_score_full_form(run, capsys) for run in (1, 2))
    assert first.keys() == second.keys()
    for name, one in first.items():
        two = second[name]
        diff = abs(two["x_pct"] - one["x_pct"])
        assert diff <= 0.2, name
        assert diff <= 2 * math.hypot(one["x_pm_pct"], two["x_pm_pct"]), name
