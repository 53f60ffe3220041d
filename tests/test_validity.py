"""The validity verdict: each check fails on a file built to break it, and passes on a good one.

Every file is small and written by the real RunFileWriter: a GPU (``gpu0``) with its 50 Hz
samples and an energy counter read every second, and a 1 kHz meter, 10 s at 200 W.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import wattlab
from wattlab.analysis.energy import energy_report
from wattlab.analysis.energy.source_energy import EnergyRow
from wattlab.analysis.energy.validity import CHECKS, invalid_reasons
from wattlab.analysis.energy.validity.figure_judge import _totals
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Marker, SourceDescriptor

pytestmark = pytest.mark.fast

MS = 1_000_000
POWER_W = 200.0
DURATION_S = 10.0


def _stream(w, sid, kind, channel, unit, t_s, values, **config):
    w.add_source(SourceDescriptor(sid, kind, "m", (Channel(channel, unit),), config=config))
    t_ns = np.round(np.asarray(t_s) * 1e9).astype(np.int64)
    w.append(sid, t_ns, t_ns, np.asarray(values, float).reshape(-1, 1),
             np.zeros(t_ns.size, np.uint8))


def _run(tmp_path, *, samples_t_s=None, meter_t_s=None, samples_uuid="GPU-a",
         counter=lambda t_s: 1000.0 + POWER_W * t_s, counter_stream=True,
         samples_config=None, markers=()):
    """The good file, with one part replaced to break one check."""
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "run.h5"
    w = RunFileWriter(str(path), {}, 0)
    t_samples = np.arange(0, 501) * 0.02 if samples_t_s is None else samples_t_s
    _stream(w, "gpu0.samples", "nvml", "power_w", "W", t_samples,
            np.full(len(t_samples), POWER_W), uuid=samples_uuid, sample_period_s=0.02,
            **(samples_config or {}))
    if counter_stream:
        reads_s = np.arange(0, 11) * 1.0
        _stream(w, "gpu0.energy", "nvml", "energy_j", "J", reads_s, counter(reads_s),
                uuid="GPU-a")
    t_meter = np.arange(0, 10_001) * 0.001 if meter_t_s is None else meter_t_s
    _stream(w, "meter", "meter", "power_w", "W", t_meter, np.full(len(t_meter), POWER_W))
    w.add_markers(list(markers))
    w.close()
    return path


def _report(path, **kw):
    with wattlab.open(str(path)) as run:
        return energy_report(run, by_marker=False, **kw)


def _row(report, source, phase="run"):
    return next(r for r in report["rows"] if r["source"] == source and r["phase"] == phase)


def _failed(row):
    return sorted(name for name, c in row["checks"].items() if not c["ok"])


def test_a_good_run_passes_every_check_on_every_figure(tmp_path):
    rep = _report(_run(tmp_path), windows=[(2.0, 7.0)])
    assert rep["valid"] and rep["invalid_figures"] == 0
    for row in rep["rows"]:
        assert list(row["checks"]) == list(CHECKS)
        assert row["valid"] and _failed(row) == []
    cross = _row(rep, "gpu0.energy")["checks"]["counter_vs_integral"]
    assert cross["applies"] and "within" in cross["reason"]
    assert _row(rep, "gpu0.samples", "window")["checks"]["counter_vs_integral"]["applies"]
    assert not _row(rep, "meter")["checks"]["counter_vs_integral"]["applies"]


def test_coverage_fails_on_a_cut_stream_and_names_the_hole(tmp_path):
    t = np.arange(0, 10_001) * 0.001
    rep = _report(_run(tmp_path, meter_t_s=t[(t < 4.0) | (t > 4.05)]), windows=[(5.0, 8.0)])
    cut = _row(rep, "meter")
    assert _failed(cut) == ["coverage"] and not rep["valid"]
    assert "has 1 hole(s) longer than 3 spacings" in cut["checks"]["coverage"]["reason"]
    assert _row(rep, "meter", "window")["valid"]  # the hole lies outside this window


def test_coverage_fails_where_a_phase_starts_before_the_stream(tmp_path):
    path = _run(tmp_path, samples_t_s=np.arange(50, 501) * 0.02,
                markers=[Marker(500 * MS, "load", "begin"), Marker(3000 * MS, "load", "end")])
    with wattlab.open(str(path)) as run:
        rep = energy_report(run, by_marker=True)
    late = _row(rep, "gpu0.samples", "load")
    assert _failed(late) == ["coverage"]
    assert "starts 0.500 s before the stream's first row (1.000 s)" in \
        late["checks"]["coverage"]["reason"]
    assert _row(rep, "meter", "load")["valid"]


def test_time_fails_where_time_goes_backwards_and_the_file_still_reports(tmp_path):
    t = np.arange(0, 10_001) * 0.001
    t[6000:] -= 0.5  # a clock step back at 6 s
    rep = _report(_run(tmp_path, meter_t_s=t), windows=[(1.0, 3.0)])
    run_row = _row(rep, "meter")
    assert "time" in _failed(run_row) and run_row["energy_j"] is None
    assert "backwards 1 time(s) in the window" in run_row["checks"]["time"]["reason"]
    assert "outside this window" in _row(rep, "meter", "window")["checks"]["time"]["reason"]
    assert _row(rep, "gpu0.samples")["valid"]  # the other streams are still reported


def test_identity_fails_on_a_swapped_gpu(tmp_path):
    rep = _report(_run(tmp_path, samples_uuid="GPU-b"))
    for source in ("gpu0.samples", "gpu0.energy"):
        row = _row(rep, source)
        assert _failed(row) == ["identity"]
        assert "name 2 devices" in row["checks"]["identity"]["reason"]
    assert _row(rep, "meter")["valid"]


def test_counter_vs_integral_and_no_silent_zero_fail_on_a_frozen_counter(tmp_path):
    rep = _report(_run(tmp_path, counter=lambda t_s: np.full(t_s.shape, 1234.0)))
    counter = _row(rep, "gpu0.energy")
    assert _failed(counter) == ["counter_vs_integral", "no_silent_zero"]
    assert "beyond the" in counter["checks"]["counter_vs_integral"]["reason"]
    assert "moved 0 J while gpu0.samples:power_w averaged 200.0 W" in \
        counter["checks"]["no_silent_zero"]["reason"]
    assert _failed(_row(rep, "gpu0.samples")) == ["counter_vs_integral"]


def test_counter_vs_integral_fails_on_a_counter_five_percent_slow(tmp_path):
    # 100 J short over 10 s; the two figures allow 2 x 0.1 s and 0.02 s of 200 W: 44 J
    rep = _report(_run(tmp_path, counter=lambda t_s: 0.95 * POWER_W * t_s))
    assert _failed(_row(rep, "gpu0.energy")) == ["counter_vs_integral"]
    rep = _report(_run(tmp_path / "1%", counter=lambda t_s: 0.99 * POWER_W * t_s))
    assert _row(rep, "gpu0.energy")["valid"]  # 20 J: within


def test_no_silent_zero_says_the_integral_stands_in_for_a_missing_counter(tmp_path):
    source = ("integrated: gpu0.samples:power_w, because nvmlDeviceGetTotalEnergyConsumption "
              "is not supported (NOT_SUPPORTED)")
    rep = _report(_run(tmp_path, counter_stream=False,
                       samples_config={"energy_source": source}))
    check = _row(rep, "gpu0.samples")["checks"]["no_silent_zero"]
    assert check["ok"] and check["applies"]
    assert "no energy counter on this GPU" in check["reason"]


def test_a_window_past_the_end_is_clipped_and_marked(tmp_path):
    rep = _report(_run(tmp_path), windows=[(5.0, 40.0)])
    window, whole = _row(rep, "meter", "window"), _row(rep, "meter")
    assert _failed(window) == ["window"] and not rep["valid"]
    assert window["t1_s"] == pytest.approx(DURATION_S)
    assert window["energy_j"] == pytest.approx(POWER_W * 5.0, rel=1e-6)  # not extrapolated
    assert window["energy_j"] < whole["energy_j"]
    assert "clipped to 5.000..10.000 s (30.000 s cut)" in window["checks"]["window"]["reason"]


def test_a_window_wholly_outside_the_run_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"window 30:40 lies outside the run \(0.000..10.000"):
        _report(_run(tmp_path), windows=[(30.0, 40.0)])


def test_cli_exit_status_strict_and_table(tmp_path, capsys):
    path = str(_run(tmp_path))
    assert main(["energy", path, "--window", "2:7", "--strict"]) == 0
    capsys.readouterr()
    assert main(["energy", path, "--window", "5:40"]) == 0  # marked, not an error
    table = capsys.readouterr().out
    assert " NO" in table and "! meter:power_w: window: asked 5..40 s" in table
    assert "invalid: 3 figure(s)" in table
    assert main(["energy", path, "--window", "5:40", "--strict", "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["valid"] is False and rep["invalid_figures"] == 3


def _figure(phase, valid, parts=()):
    row = EnergyRow("s", "c", "power", phase, 0.0, 1.0, 1.0, 1.0, 0.1, 0.9, 1.1, 1.0, 1.0,
                    0.0, 0)
    row.valid, row.parts = valid, list(parts)
    row.checks = {name: {"ok": True, "applies": True, "reason": ""} for name in CHECKS}
    return row


def test_a_total_of_figures_some_invalid_is_invalid_and_says_which():
    rows = [_figure("step#0", True), _figure("step#1", False), _figure("step#2", True),
            _figure("step per epoch", True, ["step#0", "step#1", "step#2"])]
    _totals(rows)
    total = rows[-1]
    assert total.valid is False and total.invalid_parts == ["step#1"]
    assert invalid_reasons(total.to_json()) == ["sums 1 invalid figure(s): step#1"]
    rows[1].valid = True
    _totals(rows)
    assert rows[-1].invalid_parts == []


def test_node_split_marks_a_part_from_an_invalid_figure_and_its_total(tmp_path, capsys):
    path = str(_run(tmp_path, counter=lambda t_s: np.full(t_s.shape, 1234.0)))
    assert main(["energy", path, "--node", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    (node,) = rep["nodes"]
    gpu = next(p for p in node["parts"] if p["part"] == "gpu0")
    assert gpu["valid"] is False and "no_silent_zero" in " ".join(gpu["invalid"])
    assert node["measured_valid"] is False and node["invalid_parts"] == ["gpu0"]
    assert rep["valid"] is False
    assert main(["energy", path, "--node", "--strict"]) == 1
    assert "[INVALID: sums invalid gpu0]" in capsys.readouterr().out
    assert main(["energy", str(_run(tmp_path / "good")), "--node", "--strict"]) == 0


def test_export_carries_the_verdict_as_columns(tmp_path):
    path = _run(tmp_path, counter=lambda t_s: np.full(t_s.shape, 1234.0))
    out = tmp_path / "t.csv"
    assert main(["export", str(path), "-o", str(out)]) == 0
    with out.open(encoding="utf-8") as f:
        rows = {r["source"]: r for r in csv.DictReader(f)}
    assert rows["gpu0.energy"]["valid"] == "False"
    assert rows["gpu0.energy"]["failed_checks"] == "counter_vs_integral no_silent_zero"
    assert rows["meter"]["valid"] == "True" and rows["meter"]["failed_checks"] == ""


def test_the_report_page_sums_mark_an_invalid_instance(tmp_path):
    from wattlab.analysis.report.html_report import _energy_table, phase_energy

    with wattlab.open(str(_run(tmp_path, counter=lambda t_s: np.full(t_s.shape, 1234.0)))) \
            as run:
        energy = phase_energy(run)
    j = energy.streams.index("gpu0.energy:energy_j")
    assert energy.invalid[0, j] == 1
    assert energy.failed_checks[(0, j)] == ["counter_vs_integral", "no_silent_zero"]
    assert "no: 1 of 1 (counter_vs_integral, no_silent_zero)" in _energy_table(energy)


def test_iterations_carry_the_streams_verdict_over_their_span(tmp_path):
    from wattlab.analysis.iterations import iterations

    t = np.arange(0, 10_001) * 0.001
    with wattlab.open(str(_run(tmp_path, meter_t_s=t[(t < 4.0) | (t > 4.05)]))) as run:
        cut = iterations(run, "meter:power_w", markers="none")
        whole = iterations(run, "gpu0.samples:power_w", markers="none")
    assert cut.valid is False and cut.to_json()["checks"]["coverage"]["ok"] is False
    assert any(w.startswith("invalid (docs/validity.md): coverage:") for w in cut.warnings)
    assert whole.valid is True


def test_the_runs_edges_as_printed_are_inside_it(tmp_path):
    path = _run(tmp_path, meter_t_s=np.arange(0, 10_001) * 0.001 + 0.0004)
    rep = _report(path, windows=[(0.0, 10.0), (0.0, 9.0)])
    assert _row(rep, "meter", "window")["valid"]  # 0.4 ms cut: the run starts at 0.0004 s
    assert _row(rep, "meter", "window#1")["valid"]


@pytest.mark.parametrize("as_json", [False, True])
def test_strict_over_several_runs_fails_if_any_holds_an_invalid_figure(tmp_path, capsys,
                                                                         as_json):
    good = str(_run(tmp_path / "good"))
    frozen = str(_run(tmp_path / "frozen", counter=lambda t_s: np.full(t_s.shape, 1.0)))
    out = ["--json"] if as_json else []
    assert main(["energy", good, good, "--strict", "--jobs", "1", *out]) == 0
    assert main(["energy", good, frozen, "--strict", "--jobs", "1", *out]) == 1
    assert main(["energy", good, frozen, "--jobs", "1", *out]) == 0
    capsys.readouterr()


def test_identity_tells_an_agents_gpus_apart(tmp_path):
    path = tmp_path / "agent.h5"
    w = RunFileWriter(str(path), {}, 0)
    t_ns = np.arange(0, 101) * 20 * MS
    for gpu in ("gpu0", "gpu1"):
        w.add_source(SourceDescriptor(f"node1.{gpu}.samples", "nvml", "m",
                                      (Channel("power_w", "W"),),
                                      config={"uuid": f"GPU-{gpu}", "sample_period_s": 0.02}),
                     remote_host="node1")
        w.append(f"node1.{gpu}.samples", t_ns, t_ns, np.full((t_ns.size, 1), POWER_W),
                 np.zeros(t_ns.size, np.uint8), t_sender_ns=t_ns)
    w.close()
    rep = _report(path)
    assert all(r["checks"]["identity"]["ok"] for r in rep["rows"]), rep["rows"]
