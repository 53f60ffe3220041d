"""``wattlab.count(name, n)``: work done as markers, summed by the analysis into a counter."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest

import wattlab
from wattlab.acquisition.markers import BUS_ENV
from wattlab.cli import main
from wattlab.errors import UsageError


@pytest.mark.fast
@pytest.mark.parametrize("n", [-1, math.nan, math.inf, "3", True])
def test_a_count_that_is_not_a_finite_number_above_0_is_refused(n, monkeypatch):
    monkeypatch.delenv(BUS_ENV, raising=False)  # refused outside a session too
    with pytest.raises(UsageError, match="n must be a finite number >= 0"):
        wattlab.count("tokens", n)


@pytest.mark.fast
def test_a_count_outside_a_session_does_nothing(monkeypatch):
    monkeypatch.delenv(BUS_ENV, raising=False)
    wattlab.count("tokens", 5)
    wattlab.count("tokens")
    assert "count" in wattlab.__all__


@pytest.mark.system
def test_counts_in_a_recorded_program_become_joules_per_unit(tmp_path, capsys):
    out = tmp_path / "run.h5"
    script = textwrap.dedent("""
        import time, wattlab
        with wattlab.phase("serve"):
            for _ in range(20):
                time.sleep(0.01)
                wattlab.count("tokens", 3)
            wattlab.count("requests")
    """)
    done = subprocess.run([sys.executable, "-m", "wattlab.cli", "record", "--simulate", "-o",
                           str(out), "--", sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    with wattlab.open(str(out)) as run:
        counts = [m for m in run.markers if m.kind == "count"]
    assert len(counts) == 21 and counts[0].payload == {"n": 3}
    assert main(["energy", str(out), "--per", "tokens", "--idle-w", "60", "--json"]) == 0
    rows = {r["phase"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["serve"]["units"] == 60 and rows["serve"]["units_pm"] == 0
    assert rows["serve"]["j_per_unit"] == pytest.approx(rows["serve"]["energy_j"] / 60)


@pytest.mark.fast
def test_counts_are_not_drawn_as_point_markers_on_the_report():
    from wattlab.analysis.report.html_report import phase_marks
    from wattlab.runfile import MarkerRow

    rows = [MarkerRow(1_000_000_000, "checkpoint", "point", "pid1", {}),
            *(MarkerRow(i * 1_000_000, "tokens", "count", "pid1", {"n": 4}) for i in range(500))]
    assert [m.name for m in phase_marks(rows).points] == ["checkpoint"]
