"""Energy per process on a shared GPU whose truth is known (tests/process_runs.py).

The power is idle + static while a context lives + each working process's own additive
power: the activity rule must find every process's energy, Kepler's rule must not (its
processes mix SM and memory work differently), and every joule is counted once.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.process_runs import (
    IDLE_W,
    PROCS,
    STATIC_W,
    Proc,
    write_shared_run,
)
from wattlab.analysis.attribution import energy_by_process, process_rule
from wattlab.analysis.attribution.by_process import split
from wattlab.analysis.attribution.power_stream import PowerStream, run_power_stream
from wattlab.analysis.attribution.process_parts import Baseline, place_lone_edges
from wattlab.analysis.attribution.process_rule import own_weights
from wattlab.analysis.attribution.process_table import (
    Process,
    ProcessTable,
    _assign_rows,
    read_processes,
)
from wattlab.analysis.attribution.rule import Param
from wattlab.analysis.energy import energy_report
from wattlab.cli import main
from wattlab.runfile import Run, schema

pytestmark = pytest.mark.fast


def by_pid(result, gpu: int = 0) -> dict[int, object]:
    return {p.identity["pid"]: p for p in result.gpus[gpu].processes}


def closure_ok(g) -> bool:
    parts = sum(p.energy_j for p in g.processes) + g.static_j + g.idle_j + g.unattributed_j
    return abs(parts - g.total_j) <= 1e-3 * g.total_j


def test_activity_rule_finds_each_process_energy_and_kepler_does_not(tmp_path: Path):
    with Run(str(write_shared_run(tmp_path / "r.h5"))) as run:
        act = by_pid(energy_by_process(run))
        kep = by_pid(energy_by_process(run, rule="utilisation"))
    for q in PROCS[:2]:
        assert act[q.pid].dynamic_j == pytest.approx(q.truth_j(), rel=0.01)
        assert act[q.pid].pm_j < 0.02 * q.truth_j()  # the rule predicts the power: small ±
    assert abs(kep[101].dynamic_j / PROCS[0].truth_j() - 1) > 0.1  # SM share is not power
    assert act[303].dynamic_j == kep[303].dynamic_j == 0.0  # only holds memory


def test_parts_add_up_to_the_counter_and_say_how(tmp_path: Path):
    with Run(str(write_shared_run(tmp_path / "r.h5", counter_gain=1.03))) as run:
        g = energy_by_process(run).gpus[0]
    assert closure_ok(g)
    assert "energy counter gpu0.energy:energy_j" in g.total_how and "1.0300" in g.total_how
    assert g.baseline.idle_w == pytest.approx(IDLE_W, abs=0.5) and g.baseline.idle_measured
    assert g.baseline.static_w == pytest.approx(STATIC_W, abs=0.5)
    # static: 20 W over the 16 s some process was present, scaled to the counter
    assert g.static_j == pytest.approx(STATIC_W * 16 * 1.03, rel=0.01)
    assert g.idle_j == pytest.approx(IDLE_W * 20 * 1.03, rel=0.01)


def test_without_a_counter_the_total_is_the_integral_said_so(tmp_path: Path):
    path = write_shared_run(tmp_path / "r.h5")
    with Run(str(path)) as run:
        g = energy_by_process(run).gpus[0]
        stream = g.stream
        table = read_processes(run, 0)
    assert table is not None
    alone = split(stream, table, "activity", ())
    assert "integral of gpu0.samples:power_w (no energy counter)" in alone.total_how
    assert closure_ok(alone)


def test_charged_static_and_idle_move_to_processes_each_joule_once(tmp_path: Path):
    with Run(str(write_shared_run(tmp_path / "r.h5"))) as run:
        plain = energy_by_process(run).gpus[0]
        charged = energy_by_process(run, charge=("static", "idle")).gpus[0]
    assert closure_ok(charged) and charged.static_j == pytest.approx(0, abs=1e-6)
    assert charged.idle_j == pytest.approx(0, abs=1e-6)
    assert sum(p.static_j for p in charged.processes) == pytest.approx(plain.static_j)
    assert sum(p.idle_j for p in charged.processes) == pytest.approx(plain.idle_j)
    holder = next(p for p in charged.processes if p.identity["pid"] == 303)
    assert holder.dynamic_j == 0 and holder.static_j > 0  # a context costs, work does not


def test_a_window_clips_processes_present_before_and_after_it(tmp_path: Path):
    with Run(str(write_shared_run(tmp_path / "r.h5"))) as run:
        g = energy_by_process(run).gpus[0]
        table = read_processes(run, 0)
    assert table is not None
    window = replace(g.stream, run_s=(4.0, 12.0))
    got = {p.identity["pid"]: p for p in split(window, table, "activity", ()).processes}
    for q in PROCS[:2]:
        assert got[q.pid].dynamic_j == pytest.approx(q.truth_j((4.0, 12.0)), rel=0.01)
    assert got[101].present_s == (4.0, 12.0)


def test_idle_not_measurable_is_marked_and_taken_from_the_lowest_stable_power(tmp_path: Path):
    procs = [Proc(7, (0.0, 20.0), (5.0, 12.0), 0.5, 0.1, {"comm": "always"})]
    with Run(str(write_shared_run(tmp_path / "r.h5", procs=procs))) as run:
        g = energy_by_process(run).gpus[0]
    assert not g.baseline.idle_measured and "not measurable" in g.baseline.idle_how
    assert g.baseline.idle_w == pytest.approx(IDLE_W + STATIC_W, abs=0.5)  # an upper bound
    assert closure_ok(g)
    text = json.dumps(g.to_json())
    assert "lowest stable power" in text


def test_a_reused_pid_is_another_process(tmp_path: Path):
    procs = [Proc(55, (1.0, 6.0), (2.0, 5.0), 0.5, 0.0, {"comm": "first"}),
             Proc(55, (8.0, 15.0), (9.0, 14.0), 0.8, 0.3, {"comm": "second"})]
    with Run(str(write_shared_run(tmp_path / "r.h5", procs=procs))) as run:
        got = energy_by_process(run).gpus[0].processes
    assert [p.identity["comm"] for p in got] == ["first", "second"]
    for p, q in zip(got, procs, strict=True):
        assert p.dynamic_j == pytest.approx(q.truth_j(), rel=0.01)


def test_by_job_and_by_pod_sum_processes_and_group_the_rest(tmp_path: Path, capsys):
    path = str(write_shared_run(tmp_path / "r.h5"))
    assert main(["energy", path, "--by-pod", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["groups"]["rows"]}
    assert set(rows) == {"pod-a", "(no pod)"} and rows["pod-a"]["detail"] == "ml/trainer-0"
    assert rows["(no pod)"]["processes"] == 2
    assert main(["energy", path, "--by-job"]) == 0
    out = capsys.readouterr().out
    assert "4711" in out and "4712" in out and "(no job)" in out


def test_a_gpu_that_refused_the_query_gets_the_reason_and_no_figure(tmp_path: Path, capsys):
    path = str(write_shared_run(tmp_path / "r.h5", processes=False,
                                missing="NVML_ERROR_NOT_SUPPORTED (vGPU)"))
    assert main(["energy", path, "--by-process", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"] == [] and "NOT_SUPPORTED (vGPU)" in report["missing"][0]
    assert main(["energy", path, "--by-process"]) == 0
    out = capsys.readouterr().out
    assert "no per-process figure" in out and " 0.0" not in out


def test_a_gap_in_the_process_stream_makes_its_figures_invalid(tmp_path: Path, capsys):
    path = str(write_shared_run(tmp_path / "r.h5", gap_s=(7.0, 8.0)))
    assert main(["energy", path, "--by-process"]) == 0
    out = capsys.readouterr().out
    assert "processes: gpu0.processes has 1 gap(s): NVML_ERROR_UNKNOWN" in out
    assert main(["energy", path, "--by-process", "--strict"]) == 1
    capsys.readouterr()
    assert main(["energy", path, "--by-process", "--json"]) == 0
    proc = json.loads(capsys.readouterr().out)["gpus"][0]["processes"][0]
    assert not proc["valid"] and not proc["checks"]["processes"]["ok"]
    assert proc["checks"]["coverage"]["ok"]  # the power stream's own checks travel with it


def test_time_slicing_is_said_where_the_driver_names_one_process_at_a_time(tmp_path: Path):
    with Run(str(write_shared_run(tmp_path / "r.h5"))) as run:
        assert not any("time-sliced" in c for c in energy_by_process(run).gpus[0].rule.caveats)
        table = read_processes(run, 0)
        g = energy_by_process(run).gpus[0]
    assert table is not None
    a, b = (next(p for p in table.processes if p.identity["pid"] == q.pid) for q in PROCS[:2])
    for i, t in enumerate(b.t1_s):  # the driver names one of the two per sample, in turns
        j = a.t1_s.index(t) if t in a.t1_s else None
        if j is not None and a.sm[j] > 0 and b.sm[i] > 0:
            quiet, k = (a, j) if i % 2 else (b, i)
            quiet.sm[k] = quiet.mem[k] = 0.0
    got = split(g.stream, table, "activity", ())
    assert any("time-sliced" in c for c in got.rule.caveats)


@pytest.mark.parametrize("args", [["--rule", "utilisation"], ["--charge", "idle"],
                                  ["--by-process", "--charge", "dynamic"],
                                  ["--by-process", "--by-job"],
                                  ["--by-process", "--by-marker"]])
def test_options_that_do_not_fit_are_refused(tmp_path: Path, args: list[str]):
    path = str(write_shared_run(tmp_path / "r.h5"))
    assert main(["energy", path, *args]) == 2


def test_export_by_process_writes_one_row_per_process(tmp_path: Path):
    path = str(write_shared_run(tmp_path / "r.h5"))
    out = tmp_path / "p.csv"
    assert main(["export", path, "--by-process", "-o", str(out)]) == 0
    with out.open() as f:
        rows = {int(r["pid"]): r for r in csv.DictReader(f)}
    assert sorted(rows) == [101, 202, 303]
    assert float(rows[101]["dynamic_j"]) == pytest.approx(PROCS[0].truth_j(), rel=0.01)
    assert rows[101]["slurm_job"] == "4711" and rows[101]["rule"] == "activity"
    assert float(rows[303]["dynamic_j"]) == 0.0 and np.isfinite(float(rows[303]["energy_j"]))


def test_the_report_shows_the_per_process_table(tmp_path: Path):
    from wattlab.analysis.report import build_report

    path = str(write_shared_run(tmp_path / "r.h5"))
    build_report(path, str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert "Energy per process" in page and "gpu0:101 train" in page


def test_a_simulated_gpus_truth_is_shown_beside_each_figure(tmp_path: Path, capsys):
    path = str(write_shared_run(tmp_path / "r.h5", truth=True))
    assert main(["energy", path, "--by-process"]) == 0
    out = capsys.readouterr().out
    assert "truth J" in out and "simulated truth over [0, 20000000000] ns" in out
    line = next(x for x in out.splitlines() if x.startswith("gpu0:101"))
    assert float(line.split()[-1]) == pytest.approx(PROCS[0].truth_j())


@pytest.mark.parametrize("rule", ["activity", "utilisation"])
def test_a_gpu_whose_processes_only_hold_memory_has_no_dynamic_share(tmp_path: Path,
                                                                   rule: str):
    procs = [Proc(9, (2.0, 10.0), None, identity={"comm": "holder"})]
    with Run(str(write_shared_run(tmp_path / "r.h5", procs=procs))) as run:
        g = energy_by_process(run, rule=rule).gpus[0]
    assert g.processes[0].dynamic_j == 0.0 and closure_ok(g)
    assert g.static_j == pytest.approx(STATIC_W * 8, rel=0.01)


def test_a_process_never_alone_is_priced_on_the_power_the_others_leave(tmp_path: Path):
    # 202 always works beside 303: its power is fitted on what 101's and 303's measured
    # power leave (before: on the whole power, as if the others drew none: -25 %)
    procs = [Proc(101, (1.0, 19.0), (2.0, 12.0), 0.9, 0.2), Proc(202, (1.0, 19.0), (5.0, 16.0),
             0.4, 0.8), Proc(303, (1.0, 19.0), (3.0, 18.0), 0.2, 0.1)]
    with Run(str(write_shared_run(tmp_path / "r.h5", procs=procs))) as run:
        g = energy_by_process(run).gpus[0]
    got = {p.identity["pid"]: p for p in g.processes}
    for q in procs:
        assert got[q.pid].dynamic_j == pytest.approx(q.truth_j(), rel=0.01)
    assert any("gpu0:202 never worked alone" in c for c in g.rule.caveats)
    assert closure_ok(g)


def test_one_process_on_two_gpus_is_a_row_per_gpu_and_one_sum_in_its_job(tmp_path: Path,
                                                                         capsys):
    path = str(write_shared_run(tmp_path / "r.h5", gpus=(0, 1)))
    with Run(path) as run:
        result = energy_by_process(run)
    assert [g.gpu for g in result.gpus] == [0, 1]
    assert all(closure_ok(g) for g in result.gpus)
    assert main(["energy", path, "--by-job", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["groups"]["rows"]}
    assert rows["4711"]["processes"] == 2
    assert rows["4711"]["dynamic_j"] == pytest.approx(2 * PROCS[0].truth_j(), rel=0.01)


@pytest.mark.fast
def test_a_sample_after_a_quiet_spell_covers_one_driver_period_not_the_spell():
    """The driver names no process while none works: the first sample after a quiet spell
    describes its own period (the stream's median step), not the whole spell. Before, the
    simulated shared GPU's first process was priced 20 % low: its first sample (51 % SM) was
    spread back over 0.8 s of idle context."""
    from wattlab.analysis.attribution.process_table import Process, _assign_rows

    proc = Process("gpu0:7", {"gpu": 0, "pid": 7}, (0.0, 10.0))
    t = np.array([1.0, 1.2, 1.4, 1.6, 4.0, 4.2, 4.4])  # quiet from 1.6 s to 4.0 s
    sm = np.array([0.0, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5])
    _assign_rows([proc], t, np.full(t.size, 7.0), sm, np.zeros(t.size))
    spans = np.subtract(proc.t1_s, proc.t0_s)
    assert spans == pytest.approx([0.2] * 6)
    assert proc.t0_s[3] == pytest.approx(3.8)


def test_a_share_the_run_cannot_tell_from_zero_says_so_and_prints_no_negative_energy(
        tmp_path: Path):
    # the lent H200's pairs (real per-process stream) printed -13.0 ± 133 J as a result
    from wattlab.analysis.attribution import format_by_process

    with Run(str(write_shared_run(tmp_path / "r.h5"))) as run:
        result = energy_by_process(run)
    text = format_by_process(result)
    assert "cannot be told from zero" not in text  # every share here is resolved
    g = result.gpus[0]
    first = g.processes[0]
    g.processes[0] = replace(first, dynamic_j=-13.0, energy_j=-13.0, pm_j=133.3)
    text = format_by_process(result)
    assert f"! {first.label}: its dynamic energy (-13.0 ± 133.3 J by the rule) cannot be " \
        "told from zero" in text
    row = next(line for line in text.splitlines() if line.startswith(first.label[:28]))
    assert "-13.0" not in row and row.count("≤ 120.3") == 2
    assert g.to_json()["processes"][0]["resolved"] is False


REAL_PAIRS = Path(__file__).parent / "data" / "traces" / "h200_shared-pairs2.h5"


def test_the_real_pairs_give_no_negative_weight_nor_energy(capsys):
    """The lent H200's pairs with the real per-process stream: a small-kernel process that
    started with a matrix product "measured" -91 ± 240 W per unit of SM on its samples
    alone and was printed at -13.0 J. A weight that measures nothing is not taken: the
    process is priced as one never alone, and says so."""
    with Run(str(REAL_PAIRS)) as run:
        g = energy_by_process(run).gpus[0]
    assert all(w.value > 0 for w in g.rule.weights.values())
    assert all(p.dynamic_j >= 0 for p in g.processes)
    assert any("gpu0:815" in c and "never worked alone" in c for c in g.rule.caveats)
    assert any("gpu0:815: its samples alone gave -" in n for n in g.rule.notes)
    assert closure_ok(g)


def without_rows_while_alone(src: Path, dst: Path) -> Path:
    """A copy of ``src`` whose per-process stream has no rows while one process is alone:
    as the recorder writes it since it reads the per-process utilisation only while two or
    more processes share the GPU."""
    import shutil

    import h5py

    with Run(str(src)) as run:
        table = read_processes(run, 0)
    assert table is not None
    present = [p.present_s for p in table.processes]
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        g = f[f"{schema.SOURCES}/gpu0.processes"]
        keep = np.array([sum(a <= x <= b for a, b in present) >= 2
                         for x in g[schema.TIME][:] / 1e9])
        for name in (schema.FLAGS, schema.TIME, schema.TIME_RAW, schema.VALUES):
            data, attrs = g[name][:][keep], dict(g[name].attrs)
            del g[name]
            g.create_dataset(name, data=data)
            g[name].attrs.update(attrs)
    return dst


def test_a_lone_process_without_rows_takes_the_devices_utilisation(tmp_path: Path):
    """Without rows while alone (the stream's new cadence), a lone process's activity is
    the device's (gpu0.state:gpu_util_pct). Before, every process that ran alone got 0 J.
    The device's reading is the driver's latest sample at each state read (~1 Hz), coarser
    than the rows: the matrix products alone land within 15 % of the split with rows."""
    with Run(str(REAL_PAIRS)) as run:
        ref = {p.key: p for p in energy_by_process(run).gpus[0].processes}
    with Run(str(without_rows_while_alone(REAL_PAIRS, tmp_path / "r.h5"))) as run:
        g = energy_by_process(run).gpus[0]
    assert any("taken from gpu0.state:gpu_util_pct" in n for n in g.notes)
    got = {p.key: p for p in g.processes}
    for key in ("gpu0:653", "gpu0:758", "gpu0:965"):  # matmul alone
        assert got[key].dynamic_j == pytest.approx(ref[key].dynamic_j, rel=0.15)
    assert closure_ok(g)


def test_a_lone_part_of_a_reading_is_filled_and_teaches_no_weight(tmp_path: Path):
    """A state reading stands for half a read step each side; where another process came
    or left inside that time, the part where one process was alone is still that
    process's (before, only readings alone throughout were, and the lone work beside an
    edge went to "no process active"). The device's utilisation is another scale than the
    driver's per-process SM figure: no weight is learnt on those parts."""
    with Run(str(without_rows_while_alone(REAL_PAIRS, tmp_path / "r.h5"))) as run:
        table = read_processes(run, 0)
        g = energy_by_process(run).gpus[0]
        assert table is not None
        stream = run_power_stream(run, energy_report(run, by_marker=False), table.prefix)
    edges = {p.key: set(p.present_s) for p in table.processes}
    at_others_edge = [(p.key, c, d) for p in table.processes for c, d in p.from_device
                      if any(c in edges[q.key] or d in edges[q.key]
                             for q in table.processes if q is not p)]
    assert at_others_edge
    before = own_weights(stream, 100.0, table)
    for p in table.processes:  # the device's parts ten times as active: the same weights
        p.sm = [s * 10 if (a, b) in p.from_device else s
                for a, b, s in zip(p.t0_s, p.t1_s, p.sm, strict=True)]
    assert own_weights(stream, 100.0, table) == before and before
    assert closure_ok(g)


def old_unmeasured(own: dict[str, Param]) -> dict[str, Param]:
    """``unmeasured`` as it was: a weight with no ± at all was kept, as if exact."""
    return {k: w for k, w in own.items() if w.value <= 0 or (w.pm or 0.0) >= w.value}


def one_lone_sample() -> tuple[PowerStream, ProcessTable]:
    """1 works 1-10 s (300 W per unit of SM); 2 beside it 5-10 s (40 W per unit), then alone
    10-11 s in one sample of 1 s: enough time alone (>= MIN_ALONE_S), one ratio."""
    rng = np.random.default_rng(1)
    t = np.arange(0.0, 22.0, 0.02)
    a = Process("gpu0:1", {"gpu": 0, "pid": 1}, (1.0, 20.0))
    b = Process("gpu0:2", {"gpu": 0, "pid": 2}, (4.0, 20.0))
    for q, t0_s, sm in ((a, 1.0, [0.8] * 45), (b, 5.0, 0.2 + 0.2 * rng.random(25))):
        q.t0_s = [round(t0_s + 0.2 * i, 6) for i in range(len(sm))]
        q.t1_s = [round(x + 0.2, 6) for x in q.t0_s]
        q.sm, q.mem = [float(s) for s in sm], [0.1] * len(sm)
    b.t0_s, b.t1_s, b.sm, b.mem = [*b.t0_s, 10.0], [*b.t1_s, 11.0], [*b.sm, 0.3], [*b.mem, 0.1]
    power = np.full(t.size, 100.0) + rng.normal(0.0, 2.0, t.size)
    for q, w in ((a, 300.0), (b, 40.0)):
        for t0_s, t1_s, s in zip(q.t0_s, q.t1_s, q.sm, strict=True):
            power[(t >= t0_s) & (t < t1_s)] += w * s
    stream = PowerStream("gpu0.samples:power_w", t, power, 0.02, (0.0, float(t[-1])), True, [])
    return stream, ProcessTable(0, "gpu0.processes", [a, b], (0.0, 22.0), [], [])


def test_a_weight_from_one_sample_alone_is_not_taken_as_exact(monkeypatch):
    """A weight measured on one sample alone has no ± (a spread needs two). It was kept as
    if exact: the weights' term of every ± left it out. Now it is handled as a weight whose
    ± is as large as itself: not taken, the process priced as never alone, with a ±."""
    stream, table = one_lone_sample()
    assert own_weights(stream, 100.0, table)["gpu0:2"].pm is None  # one ratio, no spread
    g = split(*one_lone_sample(), "activity", ())
    assert g.rule.weights["gpu0:2"].pm is not None
    assert any("gpu0:2: its samples alone gave" in n and "from one sample" in n
               for n in g.rule.notes)
    assert any("gpu0:2 never worked alone" in c for c in g.rule.caveats)
    monkeypatch.setattr(process_rule, "unmeasured", old_unmeasured)
    before = split(*one_lone_sample(), "activity", ())
    assert before.rule.weights["gpu0:2"].pm is None  # what the fix is for
    was = {p.key: p.pm_j for p in before.processes}
    assert all(p.pm_j >= was[p.key] for p in g.processes)
    assert next(p.pm_j for p in g.processes if p.key == "gpu0:2") > was["gpu0:2"]
    assert closure_ok(g)


def test_the_real_pairs_price_no_weight_as_exact(monkeypatch):
    """On the lent H200's copy + small-kernel pair the small-kernel process (gpu0:916)
    worked alone in one 0.8 s sample: its weight (40.2 W per unit of SM) had no ±, and its
    ± and its partner's left the weight's error out. Now it is fitted, ± all of it (the GPU
    was time-sliced), and no process's ± is smaller than before."""
    with Run(str(REAL_PAIRS)) as run:
        g = energy_by_process(run).gpus[0]
    monkeypatch.setattr(process_rule, "unmeasured", old_unmeasured)
    with Run(str(REAL_PAIRS)) as run:
        before = energy_by_process(run).gpus[0]
    assert before.rule.weights["gpu0:916"].pm is None
    assert all(w.pm is not None for w in g.rule.weights.values())
    assert any("gpu0:916" in c and "never worked alone" in c for c in g.rule.caveats)
    # the rule's ± (the baseline's moves with the split, not with the weight's ±)
    was = {p.key: p.rule_pm_j for p in before.processes}
    assert all(p.rule_pm_j >= was[p.key] for p in g.processes)
    now = {p.key: p.rule_pm_j for p in g.processes}
    assert now["gpu0:916"] > was["gpu0:916"] and now["gpu0:915"] > was["gpu0:915"]
    assert closure_ok(g)


def never_alone_in_one_mix() -> tuple[PowerStream, ProcessTable]:
    """1 works alone 1-5 s (300 W per unit of SM); 2 and 3 then share the GPU 5-25 s,
    time-sliced: the driver names them in turns (0.25 s samples, two each per 1 s window).
    3's SM is always half of 2's, so their own weights cannot be told apart; their memory
    activities vary apart, so the kinds' can (200 W per unit of SM, 300 per unit of memory)."""
    rng = np.random.default_rng(2)
    t = np.arange(0.0, 27.0, 0.02)
    a = Process("gpu0:1", {"gpu": 0, "pid": 1}, (1.0, 5.0))
    b = Process("gpu0:2", {"gpu": 0, "pid": 2}, (5.0, 25.0))
    c = Process("gpu0:3", {"gpu": 0, "pid": 3}, (5.0, 25.0))
    a.t0_s = [1.0 + 0.25 * i for i in range(16)]
    a.t1_s, a.sm, a.mem = [x + 0.25 for x in a.t0_s], [0.8] * 16, [0.1] * 16
    level, mem = 0.3 + 0.5 * rng.random(20), 0.1 + 0.5 * rng.random((2, 20))
    power = np.full(t.size, 100.0) + rng.normal(0.0, 2.0, t.size)
    power[(t >= 1.0) & (t < 5.0)] += 300.0 * 0.8
    for i in range(80):
        t0_s, named = 5.0 + 0.25 * i, i % 2  # 2 named at even samples, 3 at odd ones
        for n, (q, sm) in enumerate(((b, level[i // 4]), (c, 0.5 * level[i // 4]))):
            q.t0_s.append(t0_s)
            q.t1_s.append(t0_s + 0.25)
            q.sm.append(sm if n == named else 0.0)
            q.mem.append(float(mem[n, i // 4]) if n == named else 0.0)
            if n == named:
                power[(t >= t0_s) & (t < t0_s + 0.25)] += 200.0 * sm + 300.0 * q.mem[-1]
    stream = PowerStream("gpu0.samples:power_w", t, power, 0.02, (0.0, float(t[-1])), True, [])
    return stream, ProcessTable(0, "gpu0.processes", [a, b, c], (0.0, 27.0), [], [])


def test_the_kinds_weights_fitted_on_a_time_sliced_gpu_are_known_to_all_of_them(monkeypatch):
    """Processes never alone whose own weights cannot be told apart get the kinds' weights
    fitted on the power the measured ones leave. On a time-sliced GPU that power is
    confounded by which process the driver named, as for their own weights: those got ± all
    of it, the kinds' kept their fit's ±. Now both do, and no process's ± is smaller."""
    from wattlab.analysis.attribution import by_process

    stream, table = never_alone_in_one_mix()
    assert set(own_weights(stream, 100.0, table)) == {"gpu0:1"}
    got = {sliced: process_rule.activity_rule(stream, 100.0, table, 0.08, sliced=sliced)[0]
           for sliced in (False, True)}
    for sliced, rule in got.items():
        note = next(n for n in rule.notes if "weights of kinds of work fitted" in n)
        assert ("time-sliced" in note) is sliced
        assert not any("their own weights fitted" in n for n in rule.notes)
        assert set(rule.weights) == {"gpu0:1", *process_rule.KINDS}
    fitted, widened = got[False].weights, got[True].weights
    assert fitted["sm"].value == pytest.approx(200.0, rel=0.05)
    assert fitted["mem"].value == pytest.approx(300.0, rel=0.05)
    for k in process_rule.KINDS:
        assert 0 < (fitted[k].pm or 0.0) < fitted[k].value  # its fit's ±, unsliced
        assert widened[k].value == fitted[k].value
        assert (widened[k].pm or 0.0) >= widened[k].value  # ± all of it, sliced
    assert widened["gpu0:1"] == fitted["gpu0:1"]  # measured alone: untouched
    g = split(stream, table, "activity", ())
    assert any("time-sliced" in c for c in g.rule.caveats)  # the table is: split says so
    assert all((g.rule.weights[k].pm or 0.0) >= g.rule.weights[k].value
               for k in process_rule.KINDS)

    def unsliced(*args, sliced: bool = False, **kwargs):  # the kinds' weights as before
        return process_rule.activity_rule(*args, **kwargs, sliced=False)

    monkeypatch.setattr(by_process, "activity_rule", unsliced)
    before = split(stream, table, "activity", ())
    assert all(0 < (before.rule.weights[k].pm or 0.0) < before.rule.weights[k].value
               for k in process_rule.KINDS)
    was, now = ({p.key: p.pm_j for p in x.processes} for x in (before, g))
    assert all(now[k] >= was[k] for k in ("gpu0:2", "gpu0:3"))
    assert now["gpu0:2"] > was["gpu0:2"] and now["gpu0:3"] > was["gpu0:3"]
    assert closure_ok(g) and closure_ok(before)


@pytest.mark.fast
def test_the_readers_zero_rows_do_not_cut_a_driver_samples_interval():
    """Read every 0.15 s, a process present without a sample gets a zero row at each read;
    each driver sample (every 1/6 s) of the working one then covered only the ms since that
    read: on the simulated GPU 11 s of 25 s of work had no row, 132 J went to no process."""
    working = Process("gpu0:1", {"gpu": 0, "pid": 1}, (0.0, 10.0))
    holding = Process("gpu0:2", {"gpu": 0, "pid": 2}, (0.0, 10.0))
    driver_s, reads_s = np.arange(1, 13) / 6, np.arange(1, 14) * 0.15
    t = np.concatenate([driver_s, reads_s])
    order = np.argsort(t, kind="stable")
    pid = np.array([1.0] * driver_s.size + [2.0] * reads_s.size)[order]
    sm = np.array([0.5] * driver_s.size + [0.0] * reads_s.size)[order]
    _assign_rows([working, holding], t[order], pid, sm, np.zeros(t.size))
    spans = np.array(working.t1_s) - np.array(working.t0_s)
    assert spans == pytest.approx(np.full(12, 1 / 6))  # each sample its driver period
    assert working.t1_s == pytest.approx(driver_s.tolist())
    assert len(holding.t1_s) == reads_s.size - 1 and set(holding.sm) == {0.0}


def lone_exit(other: tuple[float, float] | None) -> tuple[PowerStream, list[Process]]:
    """A process alive from 1.5 s, working to 10.3 s; reads every 0.6 s, markers halfway."""
    t = np.arange(0.0, 14.0, 0.02)
    power = 60.0 + np.where((t >= 1.5) & (t < 10.3), 20.0 + 100.0, 0.0)  # idle 60, static 20
    stream = PowerStream("gpu0.samples:power_w", t, power, 0.01, (0.0, float(t[-1])), True, [])
    procs = [Process("gpu0:1", {"gpu": 0, "pid": 1}, (1.7, 10.6 - 0.3), exited=True)]
    if other is not None:
        procs.append(Process("gpu0:2", {"gpu": 0, "pid": 2}, other, exited=True))
    return stream, procs


@pytest.mark.fast
def test_an_edge_where_a_process_left_alone_is_placed_where_the_power_fell():
    # placed halfway (10.3 s) the marker could be up to half a read off; alone, the drop of
    # the power to idle shows where its context ended (the simulated GPU: the last process's
    # lone work, 25-45 J of a 955 J process, went to no process)
    base = Baseline(60.0, 0.1, "", True, 20.0, 1.0, "")
    stream, procs = lone_exit(None)
    procs[0].present_s = (1.7, 10.0)  # its reads at 2.0 s and 10.3 s, placed halfway
    assert place_lone_edges(procs, stream, base, 0.3) == 2
    assert procs[0].present_s == pytest.approx((1.5, 10.3), abs=0.02)
    stream, procs = lone_exit((9.5, 12.0))  # another process present then: left halfway
    place_lone_edges(procs, stream, base, 0.3)
    assert procs[0].present_s[1] == pytest.approx(10.3) and procs[1].present_s[0] == 9.5
    stream, procs = lone_exit(None)  # static not told from zero: the power cannot tell
    assert place_lone_edges(procs, stream, replace(base, static_pm_w=10.0), 0.3) == 0
    procs[0].exited = False  # no exit marker: the stream's end, not a read step
    place_lone_edges(procs, stream, base, 0.3)
    assert procs[0].present_s[1] == pytest.approx(10.3)


@pytest.mark.fast
def test_a_zero_row_inside_a_driver_sample_of_its_process_is_no_news():
    # read every 0.15 s, two reads may fall in one driver period (~1/6 s): the second finds
    # no new sample and wrote a zero row, which diluted the process's activity
    proc = Process("gpu0:7", {"gpu": 0, "pid": 7}, (0.0, 10.0))
    t = np.array([1.0, 1.15, 1.167, 1.333, 2.4])  # 1.15: a read before the 1.167 sample
    sm = np.array([0.5, 0.0, 0.5, 0.5, 0.0])  # 2.4: a read after a quiet second: idle
    notes = _assign_rows([proc], t, np.full(t.size, 7.0), sm, np.zeros(t.size))
    assert proc.t1_s == pytest.approx([1.0, 1.167, 1.333, 2.4])
    assert proc.sm == [0.5, 0.5, 0.5, 0.0]
    assert any("1 zero row(s) inside a driver sample" in n for n in notes)
