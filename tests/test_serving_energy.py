"""Energy per unit of work and per request on a serving run whose truth is known.

The run (tests/serving_runs.py) is written offline: idle plus a known power per prefill and
per decode in flight, a token counter read at 10 Hz that restarts mid-run, count markers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.serving_runs import (
    DECODE_W,
    IDLE_W,
    PREFILL_W,
    REQUESTS,
    UNIX0_NS,
    request_log_lines,
    tokens_done,
    write_serving_run,
)
from wattlab.analysis.attribution import (
    UnitRow,
    energy_by_request,
    energy_per_unit,
    find_counter,
    parse_request_log,
    run_counters,
)
from wattlab.analysis.attribution.counters import cumulative
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.runfile import Run

pytestmark = pytest.mark.fast
TOTAL_TOKENS = sum(r.output_tokens for r in REQUESTS)


@pytest.fixture
def run_path(tmp_path: Path) -> Path:
    return write_serving_run(tmp_path / "serve.h5")


@pytest.fixture
def with_requests(run_path: Path, tmp_path: Path) -> Path:
    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(request_log_lines()) + "\n")
    assert main(["import", "requests", str(log), "--into", str(run_path)]) == 0
    return run_path


def test_a_counter_that_drops_counts_from_zero_after_and_says_so():
    value, resets = cumulative(np.array([5.0, 10.0, 15.0, 3.0, 8.0]))
    assert value.tolist() == [5.0, 10.0, 15.0, 18.0, 23.0]
    assert resets == [3]


def test_tokens_per_joule_over_a_server_restart(run_path: Path):
    with Run(str(run_path)) as run:
        per = energy_per_unit(run, "tokens", idle_w=IDLE_W)
    row = {r.phase: r for r in per.rows}["run"]
    assert row.units == pytest.approx(TOTAL_TOKENS, abs=1)  # not minus the restart's drop
    assert row.energy_j == pytest.approx(IDLE_W * 20 + sum(r.truth_j() for r in REQUESTS),
                                         rel=1e-3)
    assert row.j_per_unit == pytest.approx(row.energy_j / row.units)
    dynamic = sum(r.truth_j() for r in REQUESTS)
    assert row.marginal_j_per_unit == pytest.approx(dynamic / row.units, rel=1e-3)
    assert row.valid and per.notes and "reset" in per.notes[0]
    assert per.to_json()["counter"]["resets_s"] == [pytest.approx(9.007)]


def test_a_counter_read_at_10_hz_has_an_edge_error_of_its_increments(run_path: Path):
    with Run(str(run_path)) as run:
        counter = find_counter(run_counters(run), "tokens", "x")
    n, pm, _ = counter.increase(2.55, 5.05)
    assert abs(n - (tokens_done(5.05) - tokens_done(2.55))) <= pm
    assert 0 < pm < 10  # two reads' increments: a few tokens, not the whole span's
    assert counter.increase(2.507, 5.007)[1] == 0.0  # edges on reads: nothing unknown


def test_failed_scrapes_widen_the_count_and_are_reported(tmp_path):
    path = write_serving_run(tmp_path / "gappy.h5", reset_at_s=None, failed_reads_s=(4.0, 5.5))
    with Run(str(path)) as run:
        per = energy_per_unit(run, "tokens", idle_w=IDLE_W)
        counter = find_counter(run_counters(run), "tokens", "x")
    assert counter.failed_reads == 1
    assert any("1 failed read(s)" in n for n in per.notes)
    n, pm, _ = counter.increase(2.55, 5.0)  # an edge inside the failed span
    assert abs(n - (tokens_done(5.0) - tokens_done(2.55))) <= pm
    assert pm > 10  # the whole gap's increment, not one read's


def test_count_markers_are_a_counter_and_idle_is_measured_outside_their_phase(run_path):
    with Run(str(run_path)) as run:
        per = energy_per_unit(run, "samples")
    assert per.idle_w == pytest.approx(IDLE_W)
    serve = {r.phase: r for r in per.rows}["serve"]
    assert serve.units == 2 * len(REQUESTS) and serve.units_pm == 0
    assert serve.marginal_j_per_unit == pytest.approx(
        sum(r.truth_j() for r in REQUESTS) / serve.units, rel=1e-3)


def test_a_unit_no_counter_matches_exits_2_naming_the_counters(run_path, capsys):
    assert main(["energy", str(run_path), "--per", "images"]) == 2
    err = capsys.readouterr().err
    assert "vllm:generation_tokens_total [token]" in err and "samples [1]" in err


def test_per_unit_json_carries_the_verdict(run_path, capsys):
    assert main(["energy", str(run_path), "--per", "vllm:generation_tokens_total",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is True and out["rows"][0]["phase"] == "run"
    assert {"j_per_unit_pm", "marginal_j_per_unit", "invalid_reasons"} <= set(out["rows"][0])


def test_each_request_gets_its_own_energy_and_the_sum_closes(with_requests: Path):
    with Run(str(with_requests)) as run:
        split = energy_by_request(run)
    att = split.attribution
    assert att.idle_w == pytest.approx(IDLE_W)
    assert att.rule.weights["prefill"].value == pytest.approx(PREFILL_W, rel=0.01)
    assert att.rule.weights["decode"].value == pytest.approx(DECODE_W, rel=0.01)
    for got, truth in zip(split.requests, REQUESTS, strict=True):
        assert got.energy_j == pytest.approx(truth.truth_j(), rel=0.01), got.id
        assert 0 < got.rule_pm_j < 0.001 * truth.truth_j()  # the fit is tight here
        assert got.ttft_s == pytest.approx(truth.first_s - truth.start_s)
    total = sum(r.energy_j for r in split.requests) + att.idle_j + att.unattributed_j
    assert total == pytest.approx(att.total_j, rel=1e-3)
    summary = split.summary()
    per_token = sorted(r.truth_j() / r.output_tokens for r in REQUESTS)
    assert summary["j_per_output_token_median"] == pytest.approx(per_token[2], rel=0.01)


STATIC_W = 150.0  # drawn once while any request is in flight


def static_run(tmp_path: Path, waited_s: dict[str, float] | None = None) -> Path:
    run_path = write_serving_run(tmp_path / "static.h5", static_w=STATIC_W)
    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(request_log_lines(waited_s)) + "\n")
    assert main(["import", "requests", str(log), "--into", str(run_path)]) == 0
    return run_path


@pytest.fixture
def with_static_part(tmp_path: Path) -> Path:
    return static_run(tmp_path)


def shares_vs_alone(path: Path, rule: str) -> list[float]:
    """Each request's share of the requests' energy over its alone-truth share, minus 1."""
    with Run(str(path)) as run:
        split = energy_by_request(run, rule=rule)
    att = split.attribution
    assert sum(att.parts_j.values()) + att.idle_j + att.unattributed_j == pytest.approx(
        att.total_j, rel=1e-3)
    got = {r.id: r.energy_j for r in split.requests}
    truth = {r.id: r.truth_j(STATIC_W) for r in REQUESTS}
    return [got[i] / sum(got.values()) / (truth[i] / sum(truth.values())) - 1 for i in truth]


def test_the_alone_rule_shares_by_what_each_request_costs_alone(with_static_part: Path):
    # a static part drawn once per batch: the in-flight rule charges a request by what ran
    # beside it (b, overlapping a and c, gets less than its alone share), the default
    # alone rule by what it costs alone
    assert max(abs(e) for e in shares_vs_alone(with_static_part, "alone")) < 0.01
    assert max(abs(e) for e in shares_vs_alone(with_static_part, "in-flight")) > 0.10


def test_time_waiting_for_the_batch_is_not_priced_as_prefill(tmp_path: Path):
    # d was sent 1 s before its prefill began: its log's TTFT is 1.4 s for 400 prompt
    # tokens, where the others take 1 ms a token; alone it would not have waited
    waited = static_run(tmp_path, waited_s={"d": 1.0})
    assert max(abs(e) for e in shares_vs_alone(waited, "alone")) < 0.01


def test_the_alone_rule_learns_the_static_part_and_each_kinds_alone_power(with_static_part):
    with Run(str(with_static_part)) as run:
        rule = energy_by_request(run).attribution.rule
    assert rule.name == "alone"
    assert rule.weights["prefill"].value == pytest.approx(STATIC_W + PREFILL_W, rel=0.01)
    assert rule.weights["decode"].value == pytest.approx(STATIC_W + DECODE_W, rel=0.01)


def test_by_request_takes_a_rule_and_refuses_a_process_rule(with_requests, capsys):
    assert main(["energy", str(with_requests), "--by-request", "--rule", "in-flight"]) == 0
    assert "rule: fitted power per kind" in capsys.readouterr().out
    assert main(["energy", str(with_requests), "--by-request", "--rule", "activity"]) == 2
    assert "alone, in-flight" in capsys.readouterr().err
    assert main(["energy", str(with_requests), "--by-process", "--rule", "alone"]) == 2
    assert "goes with --by-request" in capsys.readouterr().err


def test_by_request_without_a_table_says_how_to_add_one(run_path, capsys):
    assert main(["energy", str(run_path), "--by-request"]) == 2
    assert "wattlab import requests" in capsys.readouterr().err


def test_by_request_prints_the_rule_and_the_split(with_requests, capsys):
    assert main(["energy", str(with_requests), "--by-request"]) == 0
    out = capsys.readouterr().out
    assert "rule: alone" in out and "w_prefill" in out
    assert "idle" in out and "J per output token: median" in out


def _bad(lines: list[str], tmp_path: Path) -> str:
    with pytest.raises(UsageError) as e:
        parse_request_log("log.jsonl", lines, UNIX0_NS, (0.0, 20.0))
    return str(e.value)


def _line(**change: object) -> str:
    obj = json.loads(request_log_lines()[0]) | change
    return json.dumps(obj)


@pytest.mark.parametrize(("change", "field"), [
    ({"output_tokens": -3}, "'output_tokens'"),
    ({"prompt_tokens": 2.5}, "'prompt_tokens'"),
    ({"end_unix_s": UNIX0_NS / 1e9 + 1.0}, "'end_unix_s'"),
    ({"start_unix_s": UNIX0_NS / 1e9 - 100.0}, "outside the run"),
    ({"first_token_unix_s": UNIX0_NS / 1e9 + 19.0}, "'first_token_unix_s'"),
    ({"id": 7}, "'id'"),
    ({"start_unix_s": "soon"}, "'start_unix_s'"),
])
def test_bad_request_lines_name_the_line_and_field(change, field, tmp_path):
    msg = _bad([request_log_lines()[1], _line(**change)], tmp_path)
    assert "log.jsonl line 2" in msg and field in msg


def test_a_duplicate_id_names_both_lines(tmp_path):
    msg = _bad([_line(), _line()], tmp_path)
    assert "line 2" in msg and "duplicate of line 1" in msg


def test_a_log_of_another_run_is_refused_by_the_command(run_path, tmp_path, capsys):
    log = tmp_path / "other.jsonl"
    log.write_text(_line(start_unix_s=UNIX0_NS / 1e9 + 3600.0,
                         first_token_unix_s=UNIX0_NS / 1e9 + 3600.5,
                         end_unix_s=UNIX0_NS / 1e9 + 3601.0) + "\n")
    assert main(["import", "requests", str(log), "--into", str(run_path)]) == 2
    assert "outside the run" in capsys.readouterr().err
    with Run(str(run_path)) as run:  # nothing was written
        from wattlab.analysis.attribution import read_requests

        assert read_requests(run) is None


def test_aiperf_records_are_read_with_absolute_times(tmp_path):
    start_ns = UNIX0_NS + 2_000_000_000
    ok = {"metadata": {"x_request_id": "q1", "request_start_ns": start_ns,
                       "request_end_ns": start_ns + 1_500_000_000},
          "metrics": {"time_to_first_token": {"value": 250.0, "unit": "ms"},
                      "input_sequence_length": {"value": 550, "unit": "tokens"},
                      "output_sequence_length": {"value": 9, "unit": "tokens"}},
          "error": None}
    failed = {"metadata": {"x_request_id": "q2", "request_start_ns": start_ns,
                           "request_end_ns": start_ns}, "metrics": {"error_isl": {"value": 5}},
              "error": {"code": 499, "type": "RequestCancellationError"}}
    log = parse_request_log("p.jsonl", [json.dumps(ok), json.dumps(failed)], UNIX0_NS,
                            (0.0, 20.0))
    assert log.format == "aiperf" and log.skipped == 1
    (r,) = log.requests
    assert (r.id, r.prompt_tokens, r.output_tokens) == ("q1", 550, 9)
    assert r.start_s == pytest.approx(2.0) and r.first_token_s == pytest.approx(2.25)
    assert r.end_s == pytest.approx(3.5)


def test_export_writes_one_row_per_request(with_requests, tmp_path):
    import csv

    table = tmp_path / "requests.csv"
    assert main(["export", str(with_requests), "--by-request", "-o", str(table)]) == 0
    rows = list(csv.DictReader(table.read_text().splitlines()))
    assert [r["id"] for r in rows] == [r.id for r in REQUESTS]
    assert float(rows[0]["energy_j"]) == pytest.approx(REQUESTS[0].truth_j(), rel=0.01)
    assert rows[0]["rule"] == "alone" and rows[0]["valid"] == "True"


def _counter(name: str, unit: str):
    from wattlab.analysis.attribution import CounterSeries

    return CounterSeries(name, unit, "test", np.array([0.0, 1.0]), np.array([0.0, 5.0]), False)


def test_tokens_means_the_generated_ones_and_an_ambiguous_unit_is_refused():
    prompt = _counter("vllm:prompt_tokens_total", "token")
    generated = _counter("vllm:generation_tokens_total", "token")
    done = _counter("vllm:request_success_total", "request")
    assert find_counter([prompt, generated, done], "tokens", "r").name == generated.name
    assert find_counter([prompt, generated, done], "requests", "r").name == done.name
    assert find_counter([prompt, done], "vllm:prompt_tokens_total", "r") is prompt
    with pytest.raises(UsageError, match="several counters of that unit; name one: a, b"):
        find_counter([_counter("a", "sample"), _counter("b", "sample")], "samples", "r")


def test_a_metric_of_several_labelled_series_counts_as_their_sum():
    """vLLM serves finished requests as one series per finished_reason: `--per requests`
    said "several counters, name one" (found by the serve40b branch); the metric's sum is
    what a request is, read where every series was read, resets of each kept apart."""
    from wattlab.analysis.attribution import CounterSeries
    from wattlab.analysis.attribution.counters import metric_sums

    t = np.array([0.0, 1.0, 2.0, 3.0])
    stop = CounterSeries('vllm:request_success_total{finished_reason="stop"}', "request",
                         "stream scrape", t, np.array([0.0, 2.0, 4.0, 5.0]), False,
                         metric="vllm:request_success_total")
    length = CounterSeries('vllm:request_success_total{finished_reason="length"}', "request",
                           "stream scrape", t[1:], np.array([1.0, 1.0, 3.0]), False, [2.0],
                           metric="vllm:request_success_total")
    [total] = metric_sums([stop, length])
    assert total.name == "vllm:request_success_total" and total.series == 2
    assert total.t_s.tolist() == [1.0, 2.0, 3.0]
    assert total.value.tolist() == [3.0, 5.0, 8.0] and total.resets_s == [2.0]
    assert find_counter([stop, length, total], "requests", "r") is total
    assert find_counter([stop, length, total], stop.name, "r") is stop  # a series by name
    with pytest.raises(UsageError, match="several counters"):  # two metrics of the unit
        find_counter([stop, length, total, _counter("other_requests", "request")],
                     "requests", "r")


def _tokens_and_counter(trace: str) -> tuple[UnitRow, float]:
    """A real trace's J/token row over the run and its energy counter's ΔE over the run."""
    from wattlab.analysis.energy import energy_report

    with Run(str(Path(__file__).parent / "data" / "traces" / trace)) as run:
        per = energy_per_unit(run, "tokens")
        report = energy_report(run)
    [row] = [r for r in per.rows if r.phase == "run"]
    [counter] = [r for r in report["rows"] if r["phase"] == "run"
                 and r["source"] == "gpu0.energy"]
    return row, counter["energy_j"]


def test_joules_per_token_on_the_lent_gpus_server_agree_with_its_energy_counter():
    """Issue 40's consistency goal on the real trace (tests/data/traces/README.md): J/token
    from the scraped counter within 1 % of the energy counter's ΔE over the run / tokens."""
    row, counter_j = _tokens_and_counter("h200_serving-shared.h5")
    assert row.units == 8091  # every generated token, whole across the failed scrapes
    assert row.j_per_unit == pytest.approx(counter_j / row.units, rel=0.01)
    # the work drew ~1.5 % of the energy: above idle is small and says its ± is wide
    assert row.marginal_j_per_unit_pm > 0.1 * abs(row.marginal_j_per_unit)


def test_joules_per_token_of_the_5b_model_served_on_the_lent_gpu_agree_with_its_counter():
    """The second real trace (a 5 B model, tests/data/traces/README.md): its recording was cut
    at 200 s with 27 requests still running, so the counter holds the tokens generated up
    to the cut (6,024 of 6,514), and J/token still agrees with the energy counter to 1 %."""
    row, counter_j = _tokens_and_counter("h200_serving5b-shared.h5")
    assert row.units == pytest.approx(6024, abs=row.units_pm)  # interpolated at the edges
    assert row.j_per_unit == pytest.approx(counter_j / row.units, rel=0.01)


def test_an_empty_unit_is_refused_not_taken_as_no_unit(run_path: Path, capsys):
    """`--per ""` printed the plain energy table and exited 0."""
    assert main(["energy", str(run_path), "--per", " "]) == 2
    assert "--per: must be a name" in capsys.readouterr().err
