"""The Python API gives what the CLI prints: energy and calibration on the real H100 capture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import wattlab
from wattlab.analysis.calibration.stream_calibration import calibrate
from wattlab.analysis.energy.source_energy import energy_report
from wattlab.cli import main


def _cli_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _plain(value: Any) -> Any:
    """What the record looks like after a JSON round trip (tuples become lists)."""
    return json.loads(json.dumps(value))


@pytest.mark.fast
def test_energy_report_from_python_equals_the_cli(h100_run: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    printed = _cli_json(capsys, ["energy", str(h100_run), "--by-marker", "--json"])
    with wattlab.open(str(h100_run)) as run:
        computed = energy_report(run, by_marker=True)
    assert _plain(computed) == printed
    assert len(printed["rows"]) > 20  # every load segment of every view


@pytest.mark.system
def test_calibration_from_python_equals_the_cli(h100_run: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    printed = _cli_json(capsys, ["calibrate", str(h100_run), "--reference", "h100.samples",
                                 "--target", "h100.average", "--json", "--no-store"])
    with wattlab.open(str(h100_run)) as run:
        computed = calibrate(run, "h100.samples", "h100.average").to_json()
    assert printed.pop("created") <= computed.pop("created")  # when each was made: not data
    assert _plain(computed) == printed
    assert printed["kernel"] == "boxcar"
