"""Sparse-sweep prediction: k of N settings per workload, the optimum from the other workloads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.data_files import ZEUS_TRACE
from tests.test_models import synthetic
from wattlab.analysis.models.sparse_sweep import evaluate_sparse, measured_positions
from wattlab.analysis.models.sweep_results import SweepTable, load_table
from wattlab.cli import main

A40_TRACE = ZEUS_TRACE / "summary_power_a40.csv"


def sparse_csv(path: Path, table: SweepTable, workload: str, keep: tuple[float, ...]) -> Path:
    """The table as a plain workload CSV, ``workload`` only at the settings ``keep``."""
    lines = ["workload,power_limit_w,runtime_s,energy_j"]
    for w, x, t, e in zip(table.workload, table.x, table.runtime_s, table.energy_j, strict=True):
        if w != workload or x in keep:
            lines.append(f"{w},{x:g},{float(t)!r},{float(e)!r}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.fast
def test_spread_keeps_the_ends_and_random_keeps_the_default() -> None:
    rng = np.random.default_rng(0)
    assert measured_positions(9, 3, "spread", rng).tolist() == [0, 4, 8]
    assert measured_positions(9, 2, "spread", rng).tolist() == [0, 8]
    for _ in range(20):
        pos = measured_positions(7, 3, "random", rng)
        assert pos.shape == (3,) and pos[-1] == 6 and len(set(pos.tolist())) == 3


@pytest.mark.fast
def test_backtest_finds_the_optimum_of_shared_shapes() -> None:
    # 8 workloads with the demand-limited shape of a GPU: the curves differ, but each is
    # singled out by 3 points, so the pick is the measured best or one step off
    ev = evaluate_sparse(synthetic(workloads=8, noise=0.002), 3, "energy")
    assert len(ev.workloads) == 8
    assert ev.within_one_step_rate == 1.0
    assert ev.mean_regret < 0.02
    for r in ev.workloads:
        assert r.measured_x == [100.0, 200.0, 300.0]


@pytest.mark.fast
def test_backtest_pick_never_sees_the_hidden_settings() -> None:
    t = synthetic(workloads=8, noise=0.002)
    hidden = np.array([w == "w3" and x == 125.0 for w, x in zip(t.workload, t.x, strict=True)])
    # make w3 far cheaper at a hidden setting: its true best moves there, its pick cannot
    cheap = np.where(hidden, 0.2, 1.0)
    moved = SweepTable(t.x_name, t.workload, t.x, t.runtime_s * cheap, t.energy_j * cheap,
                       features=t.features)
    before, after = (next(r for r in evaluate_sparse(table, 3).workloads if r.workload == "w3")
                     for table in (t, moved))
    assert after.recommended_x == before.recommended_x
    assert after.best_x == 125.0 != before.best_x and not after.within_one_step


@pytest.mark.fast
def test_recommendation_from_a_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = synthetic(workloads=8, noise=0.002)
    csv = sparse_csv(tmp_path / "new.csv", t, "w3", (100.0, 200.0, 300.0))
    assert main(["fit", str(csv), "--sparse", "w3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured_x"] == [100.0, 200.0, 300.0] and out["default_x"] == 300.0
    assert out["settings"] == [100.0 + 25 * i for i in range(9)]
    assert 0.0 <= out["bootstrap_agreement"] <= 1.0 and out["backtest_workloads"] == 7
    lo, hi = out["saving_interval"]
    assert lo <= out["predicted_saving"] <= hi
    # the measured best of w3 (its power demand is 270 W) is 275 W
    assert abs(out["recommended_x"] - 275.0) <= 25.0
    assert main(["fit", str(csv), "--sparse", "w3"]) == 0
    assert "<- recommended" in capsys.readouterr().out


@pytest.mark.fast
@pytest.mark.parametrize("argv, message", [
    (["--measured", "9"], "N = 9 settings, got 9"),
    (["--measured", "0"], "1 to N-1"),
    (["--sparse", "nope"], "no workload named 'nope'"),
    (["--measured", "3", "--sparse", "w1"], "exclude each other"),
    (["--measured", "3", "--draws", "0"], "--draws"),
])
def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           argv: list[str], message: str) -> None:
    csv = sparse_csv(tmp_path / "t.csv", synthetic(workloads=4), "", ())
    assert main(["fit", str(csv), *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.fast
@pytest.mark.parametrize("header, missing", [
    ("workload,power_limit_w,runtime_s", "energy_j, power_w"),
    ("workload,runtime_s,energy_j", "power_limit_w, sm_clock_mhz, mem_clock_mhz"),
    ("workload,power_limit_w,energy_j", "runtime_s"),
])
def test_csv_missing_columns_exit_2_naming_file_and_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], header: str, missing: str) -> None:
    csv = tmp_path / "bad.csv"
    csv.write_text(header + "\n" + ",".join(["w0"] + ["1"] * (header.count(","))) + "\n")
    assert main(["fit", str(csv), "--measured", "2"]) == 2
    err = capsys.readouterr().err
    assert str(csv) in err and missing in err


@pytest.mark.fast
def test_power_column_is_energy_over_time(tmp_path: Path) -> None:
    csv = tmp_path / "p.csv"
    csv.write_text("workload,sm_clock_mhz,runtime_s,power_w\na,1000,2.0,100\na,1500,1.5,150\n")
    t = load_table(str(csv))
    assert t.x_name == "sm_clock_mhz" and t.energy_j.tolist() == [200.0, 225.0]


@pytest.mark.system
def test_zeus_a40_k3_within_one_step() -> None:
    # measured 2026-11-24: 48/53 workloads (91 %) within one 25 W step with k = 3 spread
    # (100, 200, 300 W), mean energy regret 1.1 %; the margin allows two workloads to move
    ev = evaluate_sparse(load_table(str(A40_TRACE)), 3, "energy")
    assert len(ev.workloads) == 53
    assert ev.within_one_step_rate >= 46 / 53
    assert ev.mean_regret < 0.02
