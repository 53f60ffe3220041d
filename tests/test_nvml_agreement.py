"""`wattlab nvml-agreement`: each NVML view against the energy counter (issue 37 item 3).

Real runs: H100 and H200 `excite` runs whose counter was read at its update rate
(tests/data/traces/README.md). The counter is the driver's own integral, so a view that
integrates what the counter integrates (the 50 Hz buffer) agrees over long windows, and
the 1 s average (a trailing mean, half a second late) does not over short ones.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattlab
from tests.data_files import data_file
from wattlab.analysis.nvml_agreement import Agreement, view_agreement
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.runfile import RunFileWriter
from wattlab.samples import Channel, SourceDescriptor

pytestmark = pytest.mark.fast
RUNS = ["h100_excite-counter-seed3", "h100_excite-counter-seed4", "h200_excite-counter-seed5"]


def table(name: str) -> dict[tuple[str, float], Agreement]:
    with wattlab.open(str(data_file(f"traces/{name}.h5"))) as run:
        return {(r.view, r.window_s): r for r in view_agreement(run)}


@pytest.mark.parametrize("name", RUNS)
def test_the_buffer_agrees_with_the_counter_and_the_average_lags(name: str) -> None:
    rows = table(name)
    assert {view for view, _ in rows} == {"50 Hz buffer", "instant", "1 s average"}
    assert rows["50 Hz buffer", 10.0].median_abs_pct < 1.0
    assert rows["50 Hz buffer", 0.1].windows > 600  # every 100 ms update of the run
    # the average is a trailing 1 s mean: at 0.1 s it is far off where the buffer is not
    assert rows["1 s average", 0.1].median_abs_pct > 4 * rows["50 Hz buffer", 0.1].median_abs_pct
    for view in ("50 Hz buffer", "instant", "1 s average"):  # longer windows agree better
        assert rows[view, 10.0].median_abs_pct < rows[view, 0.1].median_abs_pct
        assert abs(rows[view, 10.0].median_pct) < 2.0  # no view reads high or low overall


def test_the_cli_prints_the_table_and_its_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(data_file("traces/h200_excite-counter-seed5.h5"))
    assert main(["nvml-agreement", path]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "not accuracy" in out and "1 s average" in out
    assert main(["nvml-agreement", path, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["model"] == "NVIDIA H200" and len(record["rows"]) == 9


def test_a_counter_read_slowly_is_refused_with_the_option_that_fixes_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    path = str(data_file("traces/h100_torch-long.h5"))  # counter read every 9 s
    assert main(["nvml-agreement", path]) == 2
    err = capsys.readouterr().err
    assert "--nvml-intervals energy=0.1" in err and "gpu0.energy" in err
    assert main(["nvml-agreement", path, "--device", "gpu7"]) == 2
    assert "no gpu7.energy stream" in capsys.readouterr().err


def test_a_view_that_drifts_from_the_counter_shows_it(tmp_path) -> None:
    """A planted 5 % gain in the buffer appears as a +5 % median difference."""
    path = str(tmp_path / "gain.h5")
    writer = RunFileWriter(path, {}, 0)
    energy = SourceDescriptor("gpu0.energy", "nvml", "G", (Channel("energy_j", "J"),))
    samples = SourceDescriptor("gpu0.samples", "nvml", "G", (Channel("power_w", "W"),))
    writer.add_source(energy)
    writer.add_source(samples)
    t_counter = np.arange(1, 301, dtype=np.int64) * 100_000_000 + 3_000_000  # every update
    power = 300.0 + 100.0 * np.sin(np.arange(300) / 7.0)
    joules = np.concatenate([[0.0], np.cumsum(power[1:] * 0.1)])
    writer.append("gpu0.energy", t_counter, t_counter, joules[:, None],
                  np.zeros(300, np.uint8))
    t = np.arange(1, 1500, dtype=np.int64) * 20_000_000
    p = np.interp(t, t_counter[1:] - 50_000_000, power[1:]) * 1.05
    writer.append("gpu0.samples", t, t, p[:, None], np.zeros(t.size, np.uint8))
    writer.close(fit_device_clocks=False)
    with wattlab.open(path) as run:
        rows = {(r.view, r.window_s): r for r in view_agreement(run)}
    assert set(rows) == {("50 Hz buffer", w) for w in (0.1, 1.0, 10.0)}
    assert rows["50 Hz buffer", 10.0].median_pct == pytest.approx(5.0, abs=0.5)


def test_no_view_beside_the_counter_is_refused(tmp_path) -> None:
    path = str(tmp_path / "counter_only.h5")
    writer = RunFileWriter(path, {}, 0)
    writer.add_source(SourceDescriptor("gpu0.energy", "nvml", "G", (Channel("energy_j", "J"),)))
    t = np.arange(1, 50, dtype=np.int64) * 100_000_000
    writer.append("gpu0.energy", t, t, np.arange(49, dtype=np.float64)[:, None],
                  np.zeros(49, np.uint8))
    writer.close(fit_device_clocks=False)
    with wattlab.open(path) as run, pytest.raises(UsageError, match="no NVML power view"):
        view_agreement(run)
