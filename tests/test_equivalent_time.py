"""In-step power per layer by folding power samples onto the step's phase.

Synthetic runs with a known power per phase (recovered within the standard error; smeared
by a 20 ms boxcar, yet the sums stay right) and the real H100 VGG16 capture
(tests/data/layers/): its rows' energy against the energy counter per step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.data_files import LAYERS_CAPTURE
from wattlab.errors import UsageError
from wattlab.layers.capture import Captured, PlainRun, load
from wattlab.layers.equivalent_time import FoldError, fold
from wattlab.layers.kernel_trace import Layout, busy_layout, read_trace, split_steps, template
from wattlab.layers.step_energy import analyse, host_bound_warning

pytestmark = pytest.mark.fast

ROWS = ("a", "b", "c", "d")
EDGES = np.array([0.0, 0.1, 0.5, 0.8, 1.0])
POWER_W = np.array([300.0, 700.0, 450.0, 550.0])


def layout() -> Layout:
    return Layout(list(ROWS), EDGES[:-1].copy(), EDGES[1:].copy(), 0.2, "test")


def power_at(t: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The true power at unix times ``t``: the row running at that phase of its step."""
    k = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, starts.size - 2)
    phase = (t - starts[k]) / (starts[k + 1] - starts[k])
    return POWER_W[np.clip(np.searchsorted(EDGES, phase, side="right") - 1, 0, 3)]


def run(rng: np.random.Generator, step_s: float, seconds: float, *, boxcar_s: float = 0.0,
        delay_s: float = 0.025, noise_w: float = 5.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step starts (jittered lengths), 50 Hz sample stamps and their powers.

    A sample stamped ``t`` is the power at ``t - delay_s`` (``boxcar_s`` > 0: its mean over
    a window that wide centred there) plus noise.
    """
    lengths = step_s * (1 + 0.02 * rng.standard_normal(int(seconds / step_s)))
    starts = 1000.0 + np.concatenate([[0.0], np.cumsum(lengths)])
    stamps = np.arange(starts[0] + 0.1, starts[-1] - 0.05, 0.02)
    stamps += 0.0005 * rng.standard_normal(stamps.size)
    centre = stamps - delay_s
    if boxcar_s:
        offsets = np.linspace(-boxcar_s / 2, boxcar_s / 2, 41)
        power = np.mean([power_at(centre + o, starts) for o in offsets], axis=0)
    else:
        power = power_at(centre, starts)
    return starts, stamps, power + noise_w * rng.standard_normal(stamps.size)


def test_a_known_profile_comes_back_within_its_standard_error() -> None:
    rng = np.random.default_rng(3)
    starts, stamps, power = run(rng, 0.2, 60.0)
    f = fold(layout(), starts, stamps, power, delay_s=0.025, bins=20)
    got = {r.key: r for r in f.rows}
    for key, truth in zip(ROWS, POWER_W, strict=True):
        r = got[key]
        assert 0 < r.power_stat_se_w < 5 and r.power_se_w >= r.power_delay_w
        assert abs(r.power_w - truth) < 3 * r.power_stat_se_w + 1.0, key
    assert got["a"].power_delay_w > 50  # ±10 ms is half of row a's 20 ms: a big share
    assert [got[k].share for k in ROWS] == pytest.approx(np.diff(EDGES))
    true_j = float(POWER_W @ np.diff(EDGES)) * f.step_s
    assert abs(f.energy_j - true_j) < 3 * f.energy_se_j + 1e-3 * true_j
    assert sum(r.energy_j for r in f.rows) == pytest.approx(f.energy_j)
    wrong = {r.key: r.power_w for r in fold(layout(), starts, stamps, power, delay_s=0.0,
                                            bins=20).rows}
    assert abs(wrong["a"] - POWER_W[0]) > 50  # the delay matters: 25 ms is 1/8 of the step


def test_a_20ms_boxcar_smears_the_layers_but_not_the_sum() -> None:
    rng = np.random.default_rng(4)
    starts, stamps, power = run(rng, 0.03, 40.0, boxcar_s=0.02)
    true_j = float(POWER_W @ np.diff(EDGES)) * 0.03
    steps = starts.size - 1
    counter = (0.0, true_j * steps)
    f = fold(layout(), starts, stamps, power, counter_j=counter)
    got = {r.key: r.power_w for r in f.rows}
    assert got["a"] - POWER_W[0] > 50  # 3 ms at 300 W mixed with its 700 W neighbour
    assert abs(f.energy_j / f.counter_j - 1) < 0.01
    assert abs(f.energy_j - f.counter_j) < 3 * np.hypot(f.energy_se_j, f.counter_se_j) + 0.01


def test_too_few_samples_or_bad_steps_are_refused() -> None:
    with pytest.raises(FoldError, match="power samples inside"):
        fold(layout(), [0.0, 1.0], [0.5, 0.6], [100.0, 100.0])
    with pytest.raises(FoldError, match="increasing"):
        fold(layout(), [0.0, 0.0, 1.0], np.linspace(0, 1, 50), np.ones(50))


def real_capture(tmp_path: Path) -> Captured:
    for name in ("profile.json.gz", "plain.npz", "profile_meta.json"):
        src = LAYERS_CAPTURE / f"vgg16b64_{'3steps_' if name.startswith('profile.') else ''}"
        shutil.copy(f"{src}{name}", tmp_path / f"vgg16b64_{name}")
    return load(tmp_path, "vgg16b64")


def test_real_vgg16_rows_add_up_to_the_counter_and_the_step(tmp_path: Path) -> None:
    c = real_capture(tmp_path)
    out = analyse(c)
    check = out.check
    assert check.note.startswith("no plain profiled run")
    assert abs(check.energy_error) < 0.02
    assert abs(check.layers_energy_j - check.whole.energy_j) < 3 * np.hypot(
        check.layers_energy_se_j, check.whole.energy_se_j) + 0.005 * check.layers_energy_j
    assert abs(check.time_error) < 0.05  # VGG16 b64 keeps the GPU busy
    assert check.warning is None
    rows = out.rows
    assert all(r.power_w is None or 300 < r.power_w < 800 for r in rows.values())
    assert all(r.power_se_w is None or r.power_se_w > 0 for r in rows.values())
    summed = sum(r.energy_j for r in rows.values()) + sum(
        r.energy_j for r in check.outside_rows.values())
    assert summed == pytest.approx(check.layers_energy_j)
    big = rows["features.2:backward"]
    assert big.time_s > 0.002 and big.energy_j > 1.0


def test_real_samples_fold_onto_the_hooked_layout() -> None:
    z = np.load(LAYERS_CAPTURE / "vgg16b64_plain.npz")
    reference = template(split_steps(read_trace(
        LAYERS_CAPTURE / "vgg16b64_3steps_profile.json.gz")))
    f = fold(busy_layout(reference), z["step_start_unix_s"], z["sample_unix_us"] / 1e6,
             z["sample_power_w"], counter_j=(float(z["counter_j"][0]), float(z["counter_j"][1])))
    assert f.steps == z["step_start_unix_s"].size - 1 and f.samples > 500
    assert np.ptp(f.profile_w) > 5 * np.median(f.profile_se_w)  # a real shape, not noise
    assert max(r.power_delay_w for r in f.rows) > 0


def test_missing_or_broken_captures_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="missing"):
        load(tmp_path, "vgg16b64")
    real_capture(tmp_path)
    (tmp_path / "vgg16b64_profile_meta.json").write_text(json.dumps({"steps": 3}))
    with pytest.raises(UsageError, match="unreadable capture"):
        load(tmp_path, "vgg16b64")


def test_plain_run_type_holds_the_arrays() -> None:
    r = PlainRun(np.arange(3.0), np.arange(2.0), np.ones(2), (0.0, 1.0))
    assert r.counter_j == (0.0, 1.0) and r.step_start_unix_s.size == 3


@pytest.mark.parametrize("argv", [["--seconds", "1"], ["--sample-delay-ms", "-5"]])
def test_cli_refuses_bad_real_gpu_options(argv: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from wattlab.cli import main

    try:
        rc = main(["layers", "resnet50", "--train", "--measure", *argv])
    except SystemExit as e:
        rc = e.code
    assert rc == 2 and argv[0] in capsys.readouterr().err


def test_a_step_the_instruments_slow_down_is_flagged_host_bound() -> None:
    """ResNet50 b32 on the lent H200: 22.55 ms alone, 24.7 under the profiler, 27.0 beside
    the reader; VGG16 b64: 46.79, 47.4, 46.80 (GPU-bound, no warning)."""
    warning = host_bound_warning(0.02255, 0.0247, 0.02703)
    assert warning is not None and "upper bound" in warning and "27.03 ms" in warning
    assert host_bound_warning(0.02255, None, 0.02703) is not None
    assert host_bound_warning(0.04679, 0.0474, 0.0468) is None
