"""`qualify --gpu I` on a machine with no meter: the GPU's own energy counter as reference.

What it scores is agreement with the counter, not accuracy, and the output says so. The
end-to-end form runs on the simulated GPU behind the fake NVML (``--gpu 0 --simulate``);
the counter's window means are checked on a hand-built run whose truth is known.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_qualify import NVML, PROC, write_levels_run
from wattlab.analysis.qualify import qualify, reference_meaning, reference_stream
from wattlab.cli import main
from wattlab.runfile import Run

AGREEMENT = "agreement with the GPU's own energy counter, not accuracy"


@pytest.mark.fast
def test_nvml_with_a_3_pct_gain_agrees_with_the_counter_within_3_pct(tmp_path: Path) -> None:
    path = write_levels_run(tmp_path / "r.h5", counter=True)
    with Run(str(path)) as run:
        (verdict,) = qualify(run, "gpu0.energy", [NVML], PROC)
        meaning = reference_meaning(*reference_stream(run, "gpu0.energy"))
        assert reference_meaning(*reference_stream(run, "riser")) is None
    assert verdict.refused is None and verdict.valid, verdict.invalid_windows
    assert verdict.x_pct == pytest.approx(3.0, abs=0.05)
    for level in verdict.levels:  # the counter's means are the truth's, ripple and all
        assert level["reference_olympic_w"] == pytest.approx(
            level["target_olympic_w"] / 1.03, rel=1e-3)
    assert meaning is not None and meaning.startswith(AGREEMENT)


@pytest.mark.fast
def test_a_simulated_gpu_alone_takes_no_bench_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "b.toml"
    bench.write_text('[[device]]\nkind = "nvml"\ngpus = "0"\nsimulate = true\n')
    assert main(["qualify", "--gpu", "0", "--simulate", "--bench", str(bench)]) == 2
    assert "--gpu I --simulate reads a simulated GPU alone" in capsys.readouterr().err


@pytest.mark.system
def test_the_gpu_alone_is_scored_against_its_counter_end_to_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.h5"
    assert main(["qualify", "--gpu", "0", "--simulate", "--window-s", "0.5", "-o", str(out),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["reference"], doc["form"], doc["window_s"]) == ("gpu0.energy", "custom", 0.5)
    assert doc["meaning"].startswith(AGREEMENT)
    assert doc["accuracy_class"] == "none: the GPU's own energy counter"
    targets = {t["target"]: t for t in doc["targets"]}
    assert list(targets) == ["gpu0.power:average_power_w", "gpu0.power:instant_power_w"]
    for t in targets.values():
        assert t["refused"] is None and t["x_pct"] is not None
        assert [len(lv["windows_s"]) for lv in t["levels"]] == [5, 5, 5]
    with Run(str(out)) as run:  # read at every update: the windows' edges are its own reads
        counter = run.source("gpu0.energy")
        assert len(counter) / (counter.first_last_ns()[1] - counter.first_last_ns()[0]) \
            * 1e9 > 8.0


@pytest.mark.fast
def test_the_device_scripts_repeat_table_compares_x_per_target() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "qualify_repeat", Path(__file__).resolve().parent.parent / "bench/qualify_repeat.py")
    assert spec is not None and spec.loader is not None
    repeat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repeat)

    def doc(avg: float, inst: float | None, inst_pm: float = 0.1) -> dict[str, object]:
        return {"targets": [
            {"target": "gpu0.power:average_power_w", "corrected": False, "refused": None,
             "x_pct": avg, "x_pm_pct": 0.03},
            {"target": "gpu0.power:instant_power_w", "corrected": False, "refused": None,
             "x_pct": inst, "x_pm_pct": inst_pm},
            {"target": "wall:power_w", "corrected": False, "refused": "a wall", "x_pct": None}]}

    rows = repeat.repeat_rows(doc(1.50, 2.0), doc(1.62, None))
    assert [r["target"] for r in rows] == ["gpu0.power:average_power_w",
                                           "gpu0.power:instant_power_w"]
    assert rows[0]["difference_points"] == pytest.approx(0.12) and rows[0]["within_goal"]
    assert rows[1]["difference_points"] is None and not rows[1]["within_goal"]
    assert rows[0]["difference_pm_points"] == pytest.approx(0.03 * 2 ** 0.5)
    assert not rows[0]["within_scatter"]  # 0.12 points against 2 x 0.042
    assert rows[1]["within_scatter"] is None
    scattered = repeat.repeat_rows(doc(1.5, 0.06, 0.19), doc(1.5, 0.44, 0.36))[1]
    assert not scattered["within_goal"] and scattered["within_scatter"]


@pytest.mark.system
def test_the_full_form_in_parts_records_a_level_a_command_then_scores_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # one level of MLPerf's form is ~5 minutes: `--levels` keeps each command under ten
    idle, loads = tmp_path / "idle.h5", tmp_path / "loads.h5"
    for path, levels in ((idle, "idle"), (loads, "load1,load2")):
        assert main(["qualify", "--gpu", "0", "--simulate", "--window-s", "0.5",
                     "--levels", levels, "-o", str(path), "--json"]) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out) == {"run": str(path),
                                            "recorded_levels": levels.split(","),
                                            "scored": False}
        assert "score it with the other levels' run files" in captured.err
    with Run(str(idle)) as run:
        assert {m.name for m in run.markers} & {"idle", "load1", "load2"} == {"idle"}
    assert main(["qualify", str(idle), str(loads), "--reference", "gpu0.energy",
                 "--target", "gpu0.power:average_power_w", "--accuracy-class", "counter",
                 "--window-s", "0.5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"] == [str(idle), str(loads)]
    (target,) = doc["targets"]
    assert [lv["level"] for lv in target["levels"]] == ["idle", "load1", "load2"]
    assert target["x_pct"] is not None and target["x_pm_pct"] is not None


@pytest.mark.fast
@pytest.mark.parametrize(("argv", "message"), [
    (["--simulate", "--levels", "idle"], "--levels is for --gpu I"),
    (["--gpu", "0", "--levels", "idle,idle"], "each at most once"),
    (["--gpu", "0", "--levels", "peak"], "levels are idle, load1, load2")])
def test_bad_levels_are_refused(argv: list[str], message: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        raise SystemExit(main(["qualify", *argv]))
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
