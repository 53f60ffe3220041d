"""How the `alone` rule prices a request's work, and the log's scheduled time that helps it.

A request's alone cost is its prefill at the run's unqueued pace and its decode's tokens at
the run's least crowded pace (request_alone.py); a log may say when each prefill began
(``scheduled_unix_s``). Checked on hand-made requests and on the lent H200's GPU-bound
server, whose same 200 requests were also served one at a time (tests/data/traces/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.serving_runs import UNIX0_NS, request_log_lines, write_serving_run
from wattlab.analysis.attribution import energy_by_request, parse_request_log
from wattlab.analysis.attribution.by_request import activities_of
from wattlab.analysis.attribution.request_alone import priced_activities, unqueued_activities
from wattlab.analysis.attribution.request_log import Request, read_requests
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.runfile import Run

TRACES = Path(__file__).parent / "data" / "traces"
U0 = UNIX0_NS / 1e9


def _req(rid: str, start_s: float, first_s: float, end_s: float, prompt: int, output: int,
         scheduled_s: float | None = None) -> Request:
    return Request(rid, start_s, first_s, end_s, prompt, output, scheduled_s)


def _decode_s(priced: list, rid: str) -> float:
    [a] = [a for a in priced if a.owner == rid and a.kind == "decode"]
    return a.t1_s - a.t0_s


@pytest.mark.fast
def test_a_decode_stretched_by_a_crowded_batch_is_priced_as_its_tokens_alone():
    # x and y make 100 tokens each; y's ran in a crowded batch at twice x's inter-token time
    reqs = [_req("x", 0.0, 0.1, 1.1, 50, 101), _req("y", 0.0, 0.1, 2.1, 50, 101),
            *(_req(f"z{i}", 0.0, 0.1, 1.1, 50, 101) for i in range(8))]
    priced, notes, caveats = priced_activities(reqs, activities_of(reqs))
    assert _decode_s(priced, "y") == pytest.approx(_decode_s(priced, "x")) == pytest.approx(1.0)
    assert "least crowded decode pace (10 ms a token" in notes[0] and not caveats


@pytest.mark.fast
def test_a_scheduled_time_starts_the_prefill_and_waiting_costs_nothing():
    r = _req("w", 1.0, 5.0, 6.0, 100, 11, scheduled_s=4.9)
    [prefill, _] = activities_of([r])
    assert (prefill.t0_s, prefill.t1_s) == (4.9, 5.0)


@pytest.mark.fast
def test_a_log_whose_every_request_waited_says_prefill_is_overpriced():
    # every TTFT holds seconds of waiting: the unqueued prefill pace (40 ms a prompt token)
    # is slower than a decode step (10 ms), which no server's prefill is
    waited = [_req(f"q{i}", 0.0, 4.0 + i, 5.0 + i, 100, 101) for i in range(5)]
    acts = unqueued_activities(waited, activities_of(waited))
    [caveat] = priced_activities(waited, acts)[2]
    assert "scheduled_unix_s" in caveat and "overpriced" in caveat
    told = [_req(r.id, r.start_s, r.first_token_s or 0.0, r.end_s, 100, 101,
                 scheduled_s=(r.first_token_s or 0.0) - 0.01) for r in waited]
    assert priced_activities(told, unqueued_activities(told, activities_of(told)))[2] == []


def _with_scheduled(line: str, scheduled: float | None) -> str:
    return json.dumps(json.loads(line) | {"scheduled_unix_s": scheduled})


@pytest.mark.fast
def test_the_scheduled_time_is_kept_in_the_request_table(tmp_path: Path):
    run_path = write_serving_run(tmp_path / "run.h5")
    lines = request_log_lines()
    first = json.loads(lines[0])["first_token_unix_s"]
    lines = [_with_scheduled(lines[0], first - 0.25), _with_scheduled(lines[1], None),
             *lines[2:]]
    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(lines) + "\n")
    assert main(["import", "requests", str(log), "--into", str(run_path)]) == 0
    with Run(str(run_path)) as run:
        table = read_requests(run)
    assert table is not None
    a, b, *rest = table[0]
    assert a.scheduled_s == pytest.approx(a.first_token_s - 0.25)
    assert b.scheduled_s is None and all(r.scheduled_s is None for r in rest)


@pytest.mark.fast
def test_a_table_written_before_the_scheduled_column_reads_as_not_scheduled():
    with Run(str(TRACES / "h200_serving5b-exclusive.h5")) as run:
        table = read_requests(run)
    assert table is not None and all(r.scheduled_s is None for r in table[0])


@pytest.mark.fast
@pytest.mark.parametrize(("scheduled", "says"), [
    (U0 + 19.0, "'scheduled_unix_s' is outside the request's start..first token"),
    (U0 - 5.0, "'scheduled_unix_s' is outside"),
    ("soon", "'scheduled_unix_s'"),
])
def test_a_scheduled_time_outside_the_request_names_the_line_and_field(scheduled, says):
    lines = [request_log_lines()[0], _with_scheduled(request_log_lines()[1], scheduled)]
    with pytest.raises(UsageError) as e:
        parse_request_log("log.jsonl", lines, UNIX0_NS, (0.0, 20.0))
    assert "log.jsonl line 2" in str(e.value) and says in str(e.value)


def _shares(path: Path, rule: str) -> dict[str, float]:
    with Run(str(path)) as run:
        split = energy_by_request(run, rule=rule)
    total = sum(r.energy_j for r in split.requests)
    return {r.id: r.energy_j / total for r in split.requests}


@pytest.mark.fast
def test_each_requests_share_on_the_lent_h200s_server_is_within_10_pct_of_its_alone_share():
    """Issue 40's accuracy goal on the real trace: the shared run's 200 requests (up to 12 in
    flight, continuous batching) split by the alone rule, against the same requests served
    one at a time (there each interval has one request in flight: nothing to share).
    Pricing decode by its duration in the run instead missed by up to 11.7 %."""
    shared = _shares(TRACES / "h200_serving7b-shared.h5", "alone")
    alone = _shares(TRACES / "h200_serving7b-exclusive.h5", "in-flight")
    assert shared.keys() == alone.keys() and len(shared) == 200
    errors = {i: shared[i] / alone[i] - 1 for i in shared}
    assert max(abs(e) for e in errors.values()) < 0.10, max(errors.items(), key=lambda x: abs(x[1]))
    in_flight = _shares(TRACES / "h200_serving7b-shared.h5", "in-flight")
    assert max(abs(in_flight[i] / alone[i] - 1) for i in alone) > 0.5  # the other rule cannot
