"""`wattlab demo --serving`: the simulated server recorded end to end, its files beside the run."""

from __future__ import annotations

import json

import pytest

import wattlab
from tests.conftest import assert_exit_matches_loss
from wattlab.cli import main


@pytest.mark.system
def test_demo_serving_records_the_gpu_and_the_scraped_counters(tmp_path, capsys) -> None:
    out = tmp_path / "serving.h5"
    code = main(["demo", "--serving", "--requests", "6", "--seed", "3", "-o", str(out)])
    printed = capsys.readouterr().out
    assert_exit_matches_loss(code, out)
    log = [json.loads(line) for line in
           (tmp_path / "serving.requests.jsonl").read_text().splitlines()]
    truth = json.loads((tmp_path / "serving.truth.json").read_text())
    assert len(log) == len(truth["requests"]) == 6
    with wattlab.open(str(out)) as run:
        scrape = run.source("scrape")
        tokens = scrape.channel('vllm:generation_tokens_total{model_name="simulated-llm"}')
        assert run.sources["scrape"].kind == "counter"
        assert tokens[0] == 0 and tokens[-1] == truth["generation_tokens"]  # all of it seen
        start_unix_s = run.attrs["session_start_unix_ns"] / 1e9
    assert min(r["start_unix_s"] for r in log) > start_unix_s  # every request inside the run
    assert "truth:" in printed and "J/token" in printed
