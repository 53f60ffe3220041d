"""The simulated LLM server: its batching, its saturating power, its counters on a real
endpoint, its request log and its alone-energy truth (docs/scrape.md, "The simulated server")."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from wattlab.acquisition.acquirers import Chunk
from wattlab.acquisition.acquirers.scrape import ScrapeAcquirer
from wattlab.hardware.serving_plan import (
    Request,
    ServerPhysics,
    plan_serving,
    staggered_requests,
)
from wattlab.hardware.simulated_server import SimulatedServer, demo_server

LOG_KEYS = {"id", "start_unix_s", "scheduled_unix_s", "first_token_unix_s", "end_unix_s",
            "prompt_tokens", "output_tokens"}


@pytest.mark.fast
def test_the_engine_batches_up_to_its_cap_and_serves_every_token() -> None:
    requests = staggered_requests(80, seed=4, mean_gap_s=0.05)
    plan = plan_serving(requests, ServerPhysics(max_batch=6))
    assert plan.running.max() == 6 and plan.waiting.max() > 0  # the cap binds, a queue forms
    assert plan.generation_tokens[-1] == sum(r.output_tokens for r in requests)
    assert plan.prompt_tokens[-1] == sum(r.prompt_tokens for r in requests)
    assert plan.finished[-1] == len(requests) == len(plan.served)
    for counter in (plan.generation_tokens, plan.prompt_tokens, plan.finished):
        assert np.all(np.diff(counter) >= 0)
    for s in plan.served:
        chunks = -(-s.request.prompt_tokens // plan.physics.prefill_chunk)
        assert s.prefill_end - s.first_step == chunks  # prefill, then one token a step
        assert s.end_step - s.prefill_end == s.request.output_tokens - 1


@pytest.mark.fast
def test_batch_power_is_not_the_sum_of_the_requests_alone() -> None:
    physics = ServerPhysics()
    one, four = physics.utilisation(0, 1), physics.utilisation(0, 4)
    assert physics.utilisation(0, 0) == 0.0
    assert one < four < 4 * one  # a shared static part and a saturating decode part
    assert physics.utilisation(256, 3) < physics.utilisation(256, 0) + physics.utilisation(0, 3)
    assert physics.static_u + physics.prefill_u + physics.decode_u < 0.63  # under the cap


@pytest.mark.fast
def test_the_truth_is_each_request_alone_and_the_totals_add_up() -> None:
    server = demo_server(seed=5, requests=12)
    truth = server.truth()
    assert truth["generation_tokens"] == sum(r.output_tokens for r in server.requests)
    assert truth["j_per_token"] == pytest.approx(truth["energy_j"] / truth["generation_tokens"])
    model = server.gpu.model
    for alone, request in zip(truth["requests"], server.requests, strict=True):
        assert alone["alone_prefill_j"] + alone["alone_decode_j"] == pytest.approx(
            alone["alone_dynamic_j"])
        plan = plan_serving([replace(request, arrival_s=0.0)], server.physics)
        expected_j = float(np.sum(plan.utilisation)) * server.physics.step_s * model.dynamic_w
        assert alone["alone_dynamic_j"] == pytest.approx(expected_j, rel=0.02)  # ± the ripple
    shared = sum(a["alone_dynamic_j"] for a in truth["requests"])
    assert truth["dynamic_energy_j"] < shared  # batching saves energy: that is the point


@pytest.mark.fast
def test_the_request_log_has_the_documented_fields_in_wall_clock_order(tmp_path) -> None:
    server = SimulatedServer([Request("a", 0.0, 300, 5), Request("b", 0.01, 20, 3)], seed=1)
    rows = [json.loads(line) for line in
            server.write_request_log(tmp_path / "log.jsonl").read_text().splitlines()]
    assert [set(r) for r in rows] == [LOG_KEYS, LOG_KEYS]
    step = server.physics.step_s
    for r in rows:
        assert (r["start_unix_s"] <= r["scheduled_unix_s"] <= r["first_token_unix_s"]
                <= r["end_unix_s"])
    a, b = rows
    # a's 300-token prompt takes two prefill steps of 256 tokens from its arrival
    assert a["scheduled_unix_s"] == pytest.approx(a["start_unix_s"], abs=1e-6)
    assert a["first_token_unix_s"] - a["scheduled_unix_s"] == pytest.approx(2 * step, abs=1e-6)
    assert b["first_token_unix_s"] - b["start_unix_s"] == pytest.approx(step, abs=0.011)
    assert a["end_unix_s"] - a["first_token_unix_s"] == pytest.approx(4 * step, abs=1e-6)


@pytest.mark.system
def test_the_server_serves_vllm_counters_the_scraper_reads() -> None:
    clock = [0]
    server = SimulatedServer(staggered_requests(10, seed=2), clock_ns=lambda: clock[0],
                             start_ns=0).start()
    try:
        acq = ScrapeAcquirer(server.url, sleep=lambda due, step: True, clock_ns=lambda: clock[0])
        (desc,) = acq.open()
        clock[0] = round((server.lead_s + server.plan.duration_s) * 1e9)
        # the row read at open, then the poll's row, held for its batch until the stop
        first, *_, last = [r for r in acq.poll() + acq.flush() if isinstance(r, Chunk)]
        acq.close()
    finally:
        server.stop()
    tokens = desc.channel_names.index('vllm:generation_tokens_total{model_name="simulated-llm"}')
    assert first.values[0, tokens] == 0.0
    assert last.values[0, tokens] == server.plan.generation_tokens[-1]
    assert last.values[-1, tokens] == server.plan.generation_tokens[-1]
    assert len(desc.channels) == 7  # 2 token counters, 2 gauges, 3 finish reasons


@pytest.mark.system
def test_emulate_scrape_serves_the_simulated_server_until_ctrl_c() -> None:
    import re
    import sys

    from tests.conftest import ctrl_c, emulator_cli

    with emulator_cli([sys.executable, "-m", "wattlab.cli", "emulate", "scrape"]) as (
            proc, line):
        found = re.search(r"http://127\.0\.0\.1:\d+/metrics", line)
        assert found, line
        url = found.group(0)
        acq = ScrapeAcquirer(url)
        (desc,) = acq.open()
        acq.close()
        assert len(desc.channels) == 7
        assert ctrl_c(proc, 20) == 130  # every emulator: cli.md
