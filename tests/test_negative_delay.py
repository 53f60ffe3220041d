"""A negative fitted delay is said for what it is (issue 38, item 6).

The kernels are causal: a reading only ever follows the power it reports. A delay below 0
printed bare under "causal kernels" reads as a contradiction; it means the target's
timestamps lead the reference's (an offset between the streams), and the output says so.
"""

from __future__ import annotations

import pytest

from tests.data_files import data_file
from wattlab.analysis.calibration.delay_sign import lead_note
from wattlab.cli import main


@pytest.mark.fast
def test_a_clearly_negative_delay_is_named_a_timestamp_lead() -> None:
    note = lead_note(-9.917e-3, 0.71e-3)
    assert note is not None
    assert "lead the reference's by 9.92 ms" in note and "not a causal filter" in note


@pytest.mark.fast
def test_a_delay_within_two_standard_errors_of_zero_is_no_lead() -> None:
    note = lead_note(-0.4e-3, 0.33e-3)
    assert note is not None and "indistinguishable from 0" in note
    assert " lead " not in note


@pytest.mark.fast
@pytest.mark.parametrize("delay_s, se_s", [(0.0, 1e-3), (5e-3, 1e-3), (None, None),
                                           (5e-3, None)])
def test_zero_positive_or_unknown_delays_need_no_note(delay_s: float | None,
                                                       se_s: float | None) -> None:
    assert lead_note(delay_s, se_s) is None


@pytest.mark.system
def test_calibrate_says_what_demo24s_negative_tau_means(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """demo24's NVML average leads the PowerSensor3 by ~10 ms (golden: tau_s -9.9 ms)."""
    run = str(data_file("demo/demo24.h5"))
    assert main(["calibrate", "--no-store", "--reference", "ps3:power_total_w",
                 "--target", "gpu0.power:average_power_w", run]) == 0
    lines = capsys.readouterr().out.splitlines()
    tau = next(i for i, line in enumerate(lines) if line.lstrip().startswith("tau_s"))
    assert "-9.917" in lines[tau]
    assert "lead the reference's by 9.92 ms" in lines[tau + 1]
