"""Steps inside bursts: loops whose power bursts once per group of steps (issue 38 item 1).

Truth: the H200 traces in tests/data/traces mark every step ``truth_step`` with the GPU
synchronised at both edges (README there). Before this analysis, ``iterations`` counted
the groups: 9 "iterations" of ~460 ms at confidence 0.94 for 63 ResNet50 steps, and 10 at
0.93 for 30 MLP steps.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattlab
from tests.data_files import data_file
from wattlab.analysis.iterations.inner_rhythm import inner_rhythm
from wattlab.analysis.iterations.power_segments import segment
from wattlab.analysis.iterations.run_iterations import iterations
from wattlab.analysis.iterations.steps_in_bursts import UNSURE_CONFIDENCE, with_steps_in_bursts
from wattlab.cli import main

pytestmark = pytest.mark.fast
SRC = "gpu0.samples"
SPACING_S = 0.02


def loop_window(run: wattlab.Run) -> tuple[float, float, list[int]]:
    """The marked training, and the steps' begin times (ns)."""
    begins = sorted(m.effective_ns for m in run.markers
                    if m.name == "truth_step" and m.kind == "begin")
    ends = sorted(m.effective_ns for m in run.markers
                  if m.name == "truth_step" and m.kind == "end")
    return begins[0] / 1e9 - 0.1, ends[-1] / 1e9 + 0.1, begins


def steady_energy_per_step_j(run: wattlab.Run, begins: list[int]) -> float:
    """Energy from one step's begin to the next, over the steps no stall follows."""
    from wattlab.analysis.alignment import integrate_view

    t_s = np.array(begins) / 1e9
    energy = np.diff(integrate_view(run.source(SRC), ["power_w"], t_s)[0].integral)
    periods = np.diff(t_s)
    return float(energy[periods <= 1.5 * np.median(periods)].mean())


@pytest.mark.parametrize(("name", "groups", "per_group"),
                         [("h200_resnet-stall", 9, 7), ("h200_mlp-stall-3", 10, 3)])
def test_steps_inside_the_groups_are_counted(name: str, groups: int, per_group: int) -> None:
    with wattlab.open(str(data_file(f"traces/{name}.h5"))) as run:
        a, b, begins = loop_window(run)
        found = iterations(run, SRC, markers="none", t0_s=a, t1_s=b)
        truth_j = steady_energy_per_step_j(run, begins)
    assert found.method == "steps-in-bursts"
    assert (found.groups, found.steps_per_group) == (groups, per_group)
    assert found.count == len(begins)
    assert found.energy_per_iteration_j == pytest.approx(truth_j, rel=0.05)
    truth_period_s = float(np.median(np.diff(begins))) / 1e9
    assert found.period_s == pytest.approx(truth_period_s, rel=0.05)
    assert found.group_period_s is not None
    assert found.group_period_s > per_group * truth_period_s  # a group, then its stall
    assert any("group of ~" in w for w in found.warnings)


@pytest.mark.parametrize("name", ["h100_torch-long", "h100_lightning", "h100_hf-trainer"])
def test_a_step_per_burst_is_not_split(name: str) -> None:
    """A step's forward and backward passes are two humps, not two steps."""
    with wattlab.open(str(data_file(f"traces/{name}.h5"))) as run:
        a, b, begins = loop_window(run)
        found = iterations(run, SRC, markers="none", t0_s=a, t1_s=b)
    assert found.method == "power-segments" and found.groups is None
    assert abs(found.count - len(begins)) <= 0.05 * len(begins)


def test_the_cli_shows_both_levels(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(data_file("traces/h200_resnet-stall.h5"))
    with wattlab.open(path) as run:
        a, b, _ = loop_window(run)
    argv = ["iterations", path, "--source", SRC, "--markers", "none", "--from", str(a),
            "--to", str(b)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "63 iterations by steps-in-bursts" in out and "9 groups of ~7 steps" in out
    assert main([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["groups"], record["steps_per_group"], record["iterations"]) == (9, 7, 63)
    assert "bursts" not in record


def groups_of_steps(per_group: int, groups: int, *, dip_w: float, seed: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """50 Hz power of groups of 80 ms steps, a dip of ``dip_w`` at each step's end, 0.5 s
    idle between groups, noise of 5 W."""
    rng = np.random.default_rng(seed)
    t_s = np.arange(0.0, groups * (per_group * 0.08 + 0.5) + 1.0, SPACING_S)
    p = np.full(t_s.size, 120.0)
    start = 0.5
    for _ in range(groups):
        for k in range(per_group):
            s = start + k * 0.08
            busy = (t_s >= s) & (t_s < s + 0.08)
            p[busy] = 600.0
            p[busy & (t_s >= s + 0.06)] -= dip_w
        start += per_group * 0.08 + 0.5
    return (t_s * 1e9).astype(np.int64), p + rng.normal(0, 5, t_s.size)


def test_a_planted_rhythm_is_found_and_its_absence_is_said() -> None:
    t, p = groups_of_steps(6, 8, dip_w=250.0, seed=1)
    found = with_steps_in_bursts(segment([(t, p)]), t, p)
    assert (found.method, found.count, found.groups) == ("steps-in-bursts", 48, 8)
    assert found.period_s == pytest.approx(0.08, rel=0.05)
    flat_t, flat_p = groups_of_steps(6, 8, dip_w=0.0, seed=1)  # room for 6, no rhythm
    flat = with_steps_in_bursts(segment([(flat_t, flat_p)]), flat_t, flat_p)
    assert flat.method == "power-segments" and flat.count == 8
    assert flat.confidence <= UNSURE_CONFIDENCE
    assert any("no clear step rhythm" in w for w in flat.warnings)


def test_bursts_too_short_for_two_steps_hold_no_rhythm() -> None:
    t, p = groups_of_steps(1, 20, dip_w=0.0, seed=2)
    found = segment([(t, p)])
    assert inner_rhythm(t, p, found.bursts, 360.0, SPACING_S) is None
    assert with_steps_in_bursts(found, t, p) is found and found.method == "power-segments"
