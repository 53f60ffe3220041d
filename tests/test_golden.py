"""Today's analysis output equals the golden snapshot (tests/golden.py says what and why)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden import Case, cases, differences, golden_path, read, snapshot

CASES = cases()


@pytest.mark.system
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_output_matches_the_golden_snapshot(case: Case, tmp_path: Path) -> None:
    want = read(case)
    got = snapshot(case, tmp_path)
    assert want.keys() == got.keys()
    found = list(differences(want, got))
    assert not found, (f"{len(found)} difference(s) from {golden_path(case).name} "
                       "(a deliberate change: `python -m tests.golden` and say why):\n"
                       + "\n".join(found[:30]))


@pytest.mark.fast
def test_every_case_has_a_snapshot_and_every_snapshot_a_case() -> None:
    kept = set(golden_path(CASES[0]).parent.iterdir())
    assert kept == {golden_path(c) for c in CASES}


@pytest.mark.fast
def test_the_snapshot_reads_the_real_traces_as_commands_do() -> None:
    """Most cases must be clean runs of the commands: a snapshot of errors proves little."""
    for case in CASES:
        data = read(case)
        assert data["info"]["exit"] == 0 and isinstance(data["info"]["stdout"], dict), case.name
        assert isinstance(data["energy_by_marker"]["stdout"], dict), case.name


@pytest.mark.fast
@pytest.mark.parametrize(("want", "got", "expected"), [
    ({"a": 1.0}, {"a": 1.0 + 1e-9}, []),
    ({"a": 1.0}, {"a": 1.0 + 1e-4}, [".a: 1.0 -> 1.0001"]),
    ({"a": 1.0, "b": 2}, {"a": 1.0}, [".b: missing"]),
    ({"a": 1.0}, {"a": 1.0, "new": 3}, []),
    ({"a": [1, 2]}, {"a": [1]}, [".a: was a list of 2, now 1"]),
    ({"a": "x"}, {"a": "y"}, [".a: 'x' -> 'y'"]),
    ({"a": 2}, {"a": 2.0}, [".a: 2 -> 2.0"]),
    ({"a": float("nan")}, {"a": float("nan")}, []),
    ({"a": float("nan")}, {"a": 0.0}, [".a: nan -> 0.0"]),
    ({"created": "<volatile>"}, {"created": "2026-11-27"}, []),
    ({"created": "2026-01-01"}, {}, [".created: missing"]),
    ({"a": {"b": 1}}, {"a": [1]}, [".a: was an object, now list"]),
])
def test_differences_catch_what_changed(want: object, got: object, expected: list[str]) -> None:
    assert list(differences(want, got)) == expected
