"""The span a gap line prints: never "from 9.5 s to 9.5 s" (issue 38)."""

from __future__ import annotations

import pytest

from wattlab.commands.record import span_text
from wattlab.runfile import GapRow

pytestmark = pytest.mark.fast


def gap(first_ns: int | None, last_ns: int | None) -> GapRow:
    return GapRow("wall", -1, -1, first_ns, last_ns, 1, "instrument updates not read in time")


def test_a_gap_shorter_than_the_tenths_shows_milliseconds() -> None:
    assert span_text(gap(9_496_544_608, 9_541_939_724)) == " (from 9.497 s to 9.542 s)"


def test_a_longer_gap_shows_tenths_and_an_unknown_end_shows_nothing() -> None:
    assert span_text(gap(3_100_000_000, 3_800_000_000)) == " (from 3.1 s to 3.8 s)"
    assert span_text(gap(3_100_000_000, None)) == ""
