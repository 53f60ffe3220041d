"""bench/nvml_floor.py: its medians and goals, and a whole run against the fake NVML."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def floor(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("nvml_floor")


@pytest.mark.fast
def test_medians_of_the_runs_and_the_issues_ratios(floor: ModuleType) -> None:
    def run(default: float, frugal: float, smi: float) -> dict[str, object]:
        rows = {name: {"cpu_pct": 0.05} for name in floor.FLOOR_LOOPS}
        rows["calls: frugal schedule"] = {"cpu_pct": 0.02}
        rows[floor.DEFAULT] = {"cpu_pct": default, "samples_per_s": 49.7}
        rows[floor.FRUGAL] = {"cpu_pct": frugal, "samples_per_s": 49.8}
        rows[floor.SMI] = {"cpu_pct": smi, "readings_per_s": 10.0}
        return {"rows": rows}

    result = floor.report([run(0.2, 0.09, 0.1), run(0.1, 0.08, 0.09), run(0.3, 0.07, 0.08)])
    assert result["table"][floor.DEFAULT]["cpu_pct_median"] == 0.2
    assert result["table"][floor.DEFAULT]["cpu_pct_runs"] == [0.2, 0.1, 0.3]
    assert result["table"][floor.FRUGAL]["samples_per_s"] == 49.8
    goals = result["goals"]
    assert goals["default / nvidia-smi -lms 100 (goal <= 2)"] == pytest.approx(0.2 / 0.09)
    assert goals["default / floor (goal <= 1.5)"] == pytest.approx(0.2 / 0.05)
    assert goals["frugal / nvidia-smi -lms 100 (goal <= 1)"] == pytest.approx(0.08 / 0.09)
    assert goals["frugal / floor"] == pytest.approx(0.08 / 0.02)


@pytest.mark.system
def test_a_simulated_run_measures_every_reader(tmp_path: Path, spawn) -> None:
    proc = spawn([sys.executable, str(BENCH / "nvml_floor.py"), "--out", str(tmp_path),
                  "--simulate", "--seconds", "2", "--runs", "1", "--warmup", "3",
                  "--compare-reads", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    result = json.loads((tmp_path / "nvml_floor.json").read_text())
    table = result["table"]
    assert set(table) == {*BENCH_FLOOR_LOOPS, "wattlab default", "wattlab frugal"}
    for name in ("wattlab default", "wattlab frugal"):
        assert table[name]["samples_per_s"] > 40  # every driver sample (50 Hz)
        assert table[name]["cpu_pct_median"] > 0
    assert "default / floor (goal <= 1.5)" in result["goals"]
    assert result["one_call_or_two"]["average_field_equals_power_usage"] == 3
    assert (tmp_path / "run0-default.h5").exists() and (tmp_path / "run0-frugal.h5").exists()
    assert "calls: default schedule" in out and "wattlab frugal" in out


BENCH_FLOOR_LOOPS = ("calls: power 90 ms", "calls: drain 0.9 s", "calls: state 0.9 s",
                     "calls: energy 9 s", "calls: default schedule", "calls: frugal schedule")
