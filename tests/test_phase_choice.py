"""Phase-level choice: per-phase rows of a sweep, the best setting per phase, `fit --by-phase`.

Never against a real GPU: the recorded sweep uses the simulated one (``--simulate``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import wattlab
from wattlab.analysis.models.phase_choice import choose_per_phase, format_phase_report
from wattlab.analysis.models.sweep_results import PhaseTable, SweepTable, read_sweep, write_sweep
from wattlab.cli import main
from wattlab.errors import UsageError

LIMITS = (150.0, 200.0, 250.0, 300.0)


def phased_table(repeats: int = 2, noise: float = 0.01, seed: int = 0) -> SweepTable:
    """Two phases whose best power limits differ.

    "load" is memory-bound: its time does not depend on the limit, its power does, so its
    energy is lowest at the lowest limit (150 W: 270 J vs 370 J at 300 W). "compute" wants
    280 W and slows as (280/x)^1.6 below it: E = 3 (280/x)^1.6 (x + 40) is 1547 J at 150 W
    and 960 J at 300 W, so its best is the default. One setting for the whole run: 300 W
    (1330 J); each phase at its best: 1230 J, 7.5 % less.
    """
    rng = np.random.default_rng(seed)
    workload, xs, ts, es, status = [], [], [], [], []
    run, names, count, pt, pe = [], [], [], [], []
    for x in LIMITS:
        for _ in range(repeats):
            r = len(xs)
            t_load = 2.0
            e_load = t_load * (60 + min(x, 250.0) * 0.5)
            p_comp = min(x, 280.0)
            t_comp = 3.0 * (280.0 / p_comp) ** 1.6
            e_comp = t_comp * (p_comp + 40.0)
            jitter = 1 + noise * rng.standard_normal(2)
            for name, t, e, j in (("load", t_load, e_load, jitter[0]),
                                  ("compute", t_comp, e_comp, jitter[1])):
                run.append(r)
                names.append(name)
                count.append(3)
                pt.append(t)
                pe.append(e * j)
            workload.append("train")
            xs.append(x)
            ts.append(t_load + t_comp + 0.5)
            es.append(pe[-1] + pe[-2] + 30.0)
            status.append("ok")
    phases = PhaseTable(np.array(run), names, np.array(count), np.array(pt),
                        {"nvml_energy": np.array(pe)})
    return SweepTable("power_limit_w", workload, np.array(xs), np.array(ts), np.array(es),
                      energy_source="nvml_energy", status=status, default_x=300.0,
                      phases=phases, origin="synthetic")


@pytest.mark.fast
def test_best_setting_per_phase_differs() -> None:
    report = choose_per_phase(phased_table(), "energy")
    best = {p.phase: p.best_x for p in report.phases}
    assert best["load"] == 150.0  # time flat: the lowest power is the lowest energy
    assert best["compute"] == 300.0
    load = next(p for p in report.phases if p.phase == "load")
    assert load.saving == pytest.approx(1 - 270 / 370, abs=0.02)
    assert load.saving_se is not None and load.saving_se < 0.05  # two repeats: an error bar
    assert [s.n for s in load.settings] == [2, 2, 2, 2]
    # per-phase choice beats one setting for the whole run (300 W for both)
    assert report.single_best_x == 300.0
    assert report.extra_saving == pytest.approx(1 - 1230 / 1330, abs=0.02)
    text = format_phase_report(report, "W")
    assert "phase load: best 150 W" in text and "<- best" in text


@pytest.mark.fast
def test_slowdown_bound_per_phase() -> None:
    t = phased_table(noise=0.0)
    for bound in (0.0, 0.05, 0.3, None):
        for p in choose_per_phase(t, "time" if bound is None else "energy", bound).phases:
            if bound is not None:
                assert p.slowdown <= bound + 1e-9
    # EDP: compute's time explodes below 280 W, so its EDP optimum is the default too
    edp = choose_per_phase(t, "edp")
    assert {p.phase: p.best_x for p in edp.phases}["compute"] == 300.0


@pytest.mark.fast
def test_phases_round_trip_and_select(tmp_path: Path) -> None:
    t = phased_table()
    path = str(tmp_path / "p.h5")
    write_sweep(path, t)
    back = read_sweep(path)
    assert back.phases is not None and back.phases.names() == ["load", "compute"]
    np.testing.assert_allclose(back.phases.energies_j["nvml_energy"],
                               t.phases.energies_j["nvml_energy"])  # type: ignore[union-attr]
    # dropping runs renumbers the phase rows' run index
    sub = back.select(back.x >= 250.0)
    assert sub.phases is not None and len(sub.phases) == 2 * len(sub)
    assert sub.phases.run.max() == len(sub) - 1
    assert set(sub.x[sub.phases.run].tolist()) == {250.0, 300.0}
    # a failed run's phases are not used
    t.status[0] = "failed"
    r = choose_per_phase(t)
    assert next(p for p in r.phases if p.phase == "load").settings[0].n == 1


@pytest.mark.fast
def test_no_phases_is_a_clear_error() -> None:
    t = phased_table()
    t.phases = None
    with pytest.raises(UsageError, match="no phases"):
        choose_per_phase(t)
    with pytest.raises(UsageError, match="objective"):
        choose_per_phase(phased_table(), "speed")
    with pytest.raises(UsageError, match="max-slowdown"):
        choose_per_phase(phased_table(), max_slowdown=-1)


WORKLOAD = """
import time, wattlab
for i in range(2):
    with wattlab.phase("load"):
        time.sleep(0.1)
    with wattlab.phase("compute"):
        time.sleep(0.25)
"""


@pytest.mark.system
def test_simulated_sweep_with_phases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "ph.h5")
    assert main(["sweep", "--simulate", "--power-limits", "300,700", "-o", out, "--",
                 sys.executable, "-c", WORKLOAD]) == 0
    capsys.readouterr()
    t = read_sweep(out)
    assert t.phases is not None
    assert sorted(zip(t.phases.run.tolist(), t.phases.phase, strict=True)) == [
        (0, "compute"), (0, "load"), (1, "compute"), (1, "load")]
    assert t.phases.count.tolist() == [2, 2, 2, 2]
    names = np.array(t.phases.phase)
    # each phase's time is what the workload's own markers say (sleep overshoots by what the
    # scheduler gives it, more on a busy machine, never less: 2 x 0.1 s and 2 x 0.25 s)
    for r, x in enumerate(t.x):
        with wattlab.open(str(tmp_path / "ph.runs" / f"power_limit_w-{x:g}-r0.h5")) as run:
            marks = [m for m in run.markers if m.source != "session"]
        for name, least_s in (("load", 0.2), ("compute", 0.5)):
            begins = [m.time_ns for m in marks if m.name == name and m.kind == "begin"]
            ends = [m.time_ns for m in marks if m.name == name and m.kind == "end"]
            spans_s = (np.array(ends) - np.array(begins)) / 1e9
            (got,) = t.phases.time_s[(t.phases.run == r) & (names == name)]
            assert got == pytest.approx(spans_s.sum(), abs=1e-9) and got >= least_s
    for source in ("nvml_energy", "nvml_samples"):
        e = t.phases.energies_j[source]
        power = e / t.phases.time_s
        # the simulated GPU runs at full load all along: each phase draws the limit (within
        # 10 %: 0.1 s phases hold five 50 Hz samples, and the 10 Hz counter is interpolated
        # between its ticks; a read that jitters across a tick is put back on its tick)
        np.testing.assert_allclose(power, t.x[t.phases.run], rtol=0.10)
        per_run = np.bincount(t.phases.run, weights=e)
        whole = t.energies_j[source]  # (NaN where the counter stopped before the end marker)
        assert np.all(per_run[np.isfinite(whole)] < whole[np.isfinite(whole)])
    assert main(["fit", out, "--by-phase", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    phases = {p["phase"]: p for p in data["by_phase"]["phases"]}
    assert set(phases) == {"load", "compute"}
    for name, p in phases.items():
        assert p["best_x"] == 300.0 and p["default_x"] == 700.0
        # sleeping takes as long at any limit, but not as long on a busy machine: the
        # slowdown is what the recorded phase times say, and the saving is 1 - 300/700 x
        # (1 + slowdown) to the 10 % each phase's power is allowed above
        time_s = {t.x[r]: t.phases.time_s[i] for i, r in enumerate(t.phases.run)
                  if t.phases.phase[i] == name}
        assert p["slowdown"] == pytest.approx(time_s[300.0] / time_s[700.0] - 1.0)
        ratio = 300.0 / 700.0 * (1.0 + p["slowdown"])
        assert 1.0 - ratio * 1.1 / 0.9 <= p["saving"] <= 1.0 - ratio * 0.9 / 1.1
    assert "fit_error" in data  # two settings, one run each: too few to cross-validate
    assert main(["fit", out, "--by-phase"]) == 0
    assert "phase compute: best 300 W" in capsys.readouterr().out


@pytest.mark.fast
def test_each_phase_takes_energy_from_a_source_that_resolves_its_instances() -> None:
    """0.2 s steps: the 1 s average cannot resolve them, the 50 Hz samples can; a 3 s load
    stays on the average. The average's step energies are smeared flat (a wrong best)."""
    run, names, count, pt, avg, samples = [], [], [], [], [], []
    xs = []
    for r, x in enumerate(LIMITS):
        xs.append(x)
        step_true = 5.0 * (80 + 0.5 * x) if x >= 200 else 5.0 * 300 * (200 / x)
        for name, n, t, e_avg, e_true in (("load", 1, 3.0, 3.0 * (60 + 0.4 * x),
                                           3.0 * (60 + 0.4 * x)),
                                          ("step", 25, 5.0, 900.0 - x, step_true)):
            run.append(r)
            names.append(name)
            count.append(n)
            pt.append(t)
            avg.append(e_avg)
            samples.append(e_true)
    phases = PhaseTable(np.array(run), names, np.array(count), np.array(pt),
                        {"nvml_average": np.array(avg), "nvml_samples": np.array(samples)})
    table = SweepTable("power_limit_w", ["w"] * 4, np.array(xs), np.full(4, 8.0),
                       np.full(4, 2000.0), energy_source="nvml_average",
                       status=["ok"] * 4, default_x=300.0, phases=phases, origin="synthetic")
    report = choose_per_phase(table)
    by = {p.phase: p for p in report.phases}
    assert by["load"].energy_source == "nvml_average"
    assert by["step"].energy_source == "nvml_samples" and by["step"].best_x == 200.0
    assert any("shorter than nvml_average resolves" in n for n in report.notes)
    assert "[energy from nvml_samples]" in format_phase_report(report, "W")
    forced = choose_per_phase(table, energy_source="nvml_average")  # asked for: kept
    assert {p.energy_source for p in forced.phases} == {"nvml_average"}
