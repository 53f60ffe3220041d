"""bench/shared_gpu_attribution.py on the real H200 pairs: the rule against truth and Kepler's.

What must hold (BENCHMARKS.md, "Energy per process"): the activity rule is never further
from the truth than Kepler's; where the small-kernel process worked alone in the shared run
its share comes within 3 points; where it never did, the figure says so (caveat) and its ±
is not a straight face.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, dict]]:
    """Runs the bench on a trace (default its own): its exit status and its pairs by name."""
    monkeypatch.syspath_prepend(str(BENCH))
    common = importlib.import_module("common")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(common, "machine", dict)  # it asks git and the GPU: not here
    bench = importlib.import_module("shared_gpu_attribution")

    def run(*argv: str) -> tuple[int, dict]:
        monkeypatch.setattr("sys.argv", ["shared_gpu_attribution.py", *argv])
        status = bench.main() == common.GOALS_MISSED
        pairs = {r["pair"]: r for r in json.loads(
            (tmp_path / "shared_gpu_attribution.json").read_text())["pairs"]}
        return status, pairs

    return run


def outside_pm(pairs: dict) -> list[tuple[str, float, float]]:
    """Each activity-rule share whose miss (points) lies outside its rule ± (a share)."""
    return [(r["pair"], miss_pt, pm) for r in pairs.values()
            for miss_pt, pm in zip(r["activity"]["abs_err_pt"], r["activity"]["share_pm"],
                                   strict=True) if abs(miss_pt) / 100 > pm]


@pytest.mark.fast
def test_the_activity_rule_beats_keplers_and_owns_its_doubt(
        split: Callable[..., tuple[int, dict]], capsys: pytest.CaptureFixture[str]) -> None:
    missed, pairs = split()
    assert missed
    assert "NOT met" in capsys.readouterr().out
    assert set(pairs) == {"matmul+copy", "matmul+smallk", "copy+smallk", "matmul+train"}
    for r in pairs.values():
        act, kep = r["activity"], r["utilisation"]
        assert max(map(abs, act["abs_err_pt"])) <= max(map(abs, kep["abs_err_pt"])) + 0.1
    assert abs(pairs["matmul+smallk"]["activity"]["abs_err_pt"][1]) < 3.0
    hard = pairs["copy+smallk"]["activity"]
    assert any("never worked alone" in c for c in hard["rule"]["caveats"])
    assert any("time-sliced" in c for c in hard["rule"]["caveats"])
    assert hard["share_pm"][1] > 0.05  # the borrowed power's doubt is in the ±


@pytest.mark.fast
def test_reading_the_stream_five_times_as_often_does_not_save_the_small_kernels(
        split: Callable[..., tuple[int, dict]], capsys: pytest.CaptureFixture[str]) -> None:
    # h200_shared-pairs3.h5: the same pairs recorded with `--nvml-intervals processes=0.18`
    # (BENCHMARKS.md): more of the driver's samples weigh its view of the small-kernel loop
    # (busy SMs at a few % of the power) more, for both rules: the goal's 3 points missed
    # by both (activity rule 7.8 and 30.9 points, Kepler's 22.1 and 23.9, since zero rows
    # inside a process's own driver sample no longer dilute its activity: 14.0 and 15.7
    # before, and 32 and 24 before each driver sample's interval was taken between the
    # driver's own stamps); every activity-rule share within its ±.
    trace = Path(__file__).resolve().parent / "data" / "traces" / "h200_shared-pairs3.h5"
    missed, pairs = split(str(trace))
    assert missed
    assert "the run's gpu0.processes" in capsys.readouterr().out
    for pair in ("matmul+smallk", "copy+smallk"):
        act, kepler = (abs(pairs[pair][rule]["abs_err_pt"][1])
                       for rule in ("activity", "utilisation"))
        assert act > 3.0 and kepler > 3.0, (pair, act, kepler)
    assert outside_pm(pairs) == []


@pytest.mark.fast
def test_every_driver_sample_read_still_misses_the_small_kernels_and_says_so(
        split: Callable[..., tuple[int, dict]]) -> None:
    # h200_shared-pairs4.h5: the pairs read every 0.15 s (every driver sample) by the reader
    # that asks at the two reads after the GPU was shared (BENCHMARKS.md): the whole stream
    # then costs +1.9 % of a core, and the small-kernel shares are still 6.8 and 26.5 points
    # off (the driver's busy-SM view of them): the goal (3 points) cannot be bought with
    # reads. Every activity-rule share lies within its ±.
    trace = Path(__file__).resolve().parent / "data" / "traces" / "h200_shared-pairs4.h5"
    missed, pairs = split(str(trace))
    assert missed
    for pair in ("matmul+smallk", "copy+smallk"):
        assert abs(pairs[pair]["activity"]["abs_err_pt"][1]) > 3.0, pair
    assert outside_pm(pairs) == []


@pytest.mark.fast
def test_a_small_process_is_as_uncertain_in_joules_as_the_one_beside_it(
        split: Callable[..., tuple[int, dict]]) -> None:
    # The split is zero-sum: joules the rule mispredicts go from one process to the other.
    # The rule's error times each process's own energy gave the small-kernel process beside
    # the matrix product 0.010 ± 0.006 of the pair's joules; its exclusive runs say 0.048.
    # h200_shared-pairs2.h5: the pairs with the run's own per-process stream (BENCHMARKS.md)
    _, pairs = split(str(Path(__file__).resolve().parent / "data" / "traces"
                         / "h200_shared-pairs2.h5"))
    assert outside_pm(pairs) == []
    small = pairs["matmul+smallk"]["activity"]
    assert small["share_pm"][1] > 0.04  # the miss: 0.038


@pytest.mark.fast
def test_lone_stretches_in_the_shared_run_do_not_rescue_the_rule_and_the_pm_owns_it(
        split: Callable[..., tuple[int, dict]]) -> None:
    # `bash bench/device_pairs_stagger_41.sh 0.5 3` (BENCHMARKS.md): in each shared run the
    # shorter workload worked alone for half its alone time (~5 s, 5-6 of the reader's reads)
    # beside the other's live context. Recorded after the zero-sum ± was written, so it is
    # that ± checked on runs it was not made on: every share lies within it, although the
    # activity rule misses the goal on every pair (2 of 4 by more than Kepler's).
    _, pairs = split(str(Path(__file__).resolve().parent / "data" / "traces"
                         / "h200_shared-pairs-stagger3.h5"))
    worse = 0
    assert outside_pm(pairs) == []
    for r in pairs.values():
        act, kep = r["activity"], r["utilisation"]
        assert max(map(abs, act["abs_err_pt"])) > 3.0
        worse += max(map(abs, act["abs_err_pt"])) > max(map(abs, kep["abs_err_pt"]))
    assert worse == 2


@pytest.mark.fast
def test_a_small_process_the_driver_calls_idle_while_it_works_is_still_covered(
        split: Callable[..., tuple[int, dict]]) -> None:
    # The same job with a ~1.4 s lone stretch (`... 0.5 1`): beside the matrix product the
    # driver gave the small-kernel loop 0 % SM at its last two reads while it still worked,
    # so no row shows that work. On a time-sliced GPU a 0 % row may be "not named" rather
    # than "rested": the rule's ± then spans each process's presence, not its working rows
    # (which gave 0.006 of the pair's joules against a 0.026 miss).
    _, pairs = split(str(Path(__file__).resolve().parent / "data" / "traces"
                         / "h200_shared-pairs-stagger1.h5"))
    small = pairs["matmul+smallk"]["activity"]
    assert any("time-sliced" in c for c in small["rule"]["caveats"])
    assert 0.026 - 0.002 < abs(small["abs_err_pt"][1]) / 100 <= small["share_pm"][1]
    assert outside_pm(pairs) == []


def shared_gpu_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """tests/with_device/shared_gpu.py, loaded with a stand-in torch (its workloads need a
    GPU; its options do not), under a name of its own so no later import gets the stand-in."""
    monkeypatch.setitem(sys.modules, "torch", ModuleType("torch"))
    path = Path(__file__).resolve().parent / "with_device" / "shared_gpu.py"
    spec = importlib.util.spec_from_file_location("shared_gpu_options", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.fast
@pytest.mark.parametrize(("verb", "option", "value"), [
    ("pairs", "--stagger", "nan"), ("pairs", "--stagger", "inf"), ("pairs", "--stagger", "-0.5"),
    ("pairs", "--scale", "nan"), ("pairs", "--scale", "-inf"), ("pairs", "--scale", "-3"),
    ("pairs", "--scale", "0"), ("work matmul", "--scale", "inf")])
def test_the_pairs_job_refuses_a_stagger_or_scale_it_cannot_run(
        verb: str, option: str, value: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # a nan, inf or negative value ended in a traceback (time.sleep, round) minutes into a
    # recording; now argparse refuses it at once, naming the option and its range
    parser = shared_gpu_script(monkeypatch).parser()
    with pytest.raises(SystemExit) as stop:
        parser.parse_args([*verb.split(), f"{option}={value}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: must be a number" in err and repr(value) in err
    args = parser.parse_args(["pairs", "--stagger", "0.5", "--scale", "3"])
    assert (args.stagger, args.scale) == (0.5, 3.0)
