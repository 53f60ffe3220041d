"""The report's stored-calibration section carries the calibration's validity verdict (issue 37)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from tests.test_calibrate_validity import _record, _run
from wattlab.analysis.calibration import store_in_run
from wattlab.analysis.report.html_report import build_report


def validity_row(page: str) -> str:
    """The calibration table's validity row, as HTML."""
    table = page[page.index("<h2>NVML calibration"):]
    row = re.search(r"<tr[^>]*><td[^>]*>validity</td>(.*?)</tr>", table)
    assert row, "the calibration table has no validity row"
    return html.unescape(row.group(1))


@pytest.mark.system  # a report is drawn (matplotlib, a few seconds)
def test_a_stored_invalid_calibration_says_not_valid_and_names_the_failed_checks(tmp_path):
    path = _run(tmp_path, samples_uuid="GPU-b")  # a swapped GPU: identity fails everywhere
    store_in_run(str(path), _record(path))
    result = build_report(str(path), str(tmp_path / "r.html"))
    (view,) = result.calibrations
    assert view.stored
    page = Path(result.html_path).read_text(encoding="utf-8")
    row = validity_row(page)
    assert "<span class='low'>NOT VALID: 6 of 6 figures failed their checks" in row
    assert "params (identity)" in row and "phase:high (identity)" in row


@pytest.mark.system
def test_a_stored_valid_calibration_says_valid(tmp_path):
    path = _run(tmp_path)
    store_in_run(str(path), _record(path))
    page = Path(build_report(str(path), str(tmp_path / "r.html")).html_path).read_text(
        encoding="utf-8")
    assert validity_row(page) == "<td class=\"l\">valid: all 6 figures passed their checks</td>"
