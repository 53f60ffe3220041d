"""bench/serving_shares.py: shares side by side, and its run on the lent H200's traces."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from wattlab.errors import UsageError

BENCH = Path(__file__).resolve().parent.parent / "bench"
TRACES = Path(__file__).resolve().parent / "data" / "traces"


@pytest.fixture
def shares(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    module = importlib.import_module("serving_shares")
    monkeypatch.setattr(importlib.import_module("common"), "RESULTS", tmp_path)
    return module


@pytest.mark.fast
def test_a_share_is_compared_with_its_exclusive_share(shares: ModuleType) -> None:
    # shared 1:1:2 against exclusive 1:1:1: a is 1/4 against 1/3, c 1/2 against 1/3
    got = shares.compare({"a": 10.0, "b": 10.0, "c": 20.0, "x": 5.0},
                         {"a": 30.0, "b": 30.0, "c": 30.0})
    errors = {r["id"]: r["share_error"] for r in got["rows"]}
    assert errors == pytest.approx({"a": -0.25, "b": -0.25, "c": 0.5})
    assert got["only_shared"] == ["x"] and got["within_goal"] == 0.0
    assert got["worst"] == pytest.approx(0.5)


@pytest.mark.fast
@pytest.mark.parametrize(("shared", "exclusive", "says"), [
    ({"a": 1.0}, {"a": 1.0, "b": 2.0}, "1 request(s) in both runs"),
    ({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 0.0}, "no energy above idle"),
])
def test_runs_that_cannot_be_compared_are_refused(shares: ModuleType, shared, exclusive,
                                                   says) -> None:
    with pytest.raises(UsageError, match=re.escape(says)):
        shares.compare(shared, exclusive)


@pytest.mark.system  # the result's machine record asks git for the commit
def test_the_lent_h200s_runs_write_their_rows_side_by_side(shares: ModuleType,
                                                           tmp_path: Path, capsys) -> None:
    assert shares.main([str(TRACES / "h200_serving7b-shared.h5"),
                        str(TRACES / "h200_serving7b-exclusive.h5")]) == 0
    result = json.loads((tmp_path / "serving_shares.json").read_text())
    assert result["requests"] == 200 == len(result["rows"])
    assert result["within_goal"] == 1.0 and "| shared vs exclusive |" in capsys.readouterr().out


@pytest.mark.fast
def test_a_run_without_a_request_table_exits_2(shares: ModuleType, capsys) -> None:
    assert shares.main([str(TRACES / "h100_torch-short.h5"),
                        str(TRACES / "h200_serving7b-exclusive.h5")]) == 2
    assert "no request table" in capsys.readouterr().err
