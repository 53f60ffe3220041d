"""MCP39F511N source against its emulator on a real pty, and through the command line."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

import wattlab
from tests.conftest import assert_exit_matches_loss, ctrl_c, emulator_cli, running
from wattlab.acquisition.acquirers.acquirer import Chunk, Reading
from wattlab.acquisition.acquirers.mcp39f511_acquirer import Mcp39f511Acquirer
from wattlab.analysis.energy.source_energy import energy_report
from wattlab.cli import main
from wattlab.drivers.mcp39f511 import Mcp39f511
from wattlab.drivers.transport import SerialTransport
from wattlab.hardware.emulators.mcp39f511_emulator import Mcp39f511Emulator
from wattlab.samples import Gap


def wave_w(t_ns: np.ndarray) -> np.ndarray:
    """300 W with a 100 W step every 0.25 s: each update's mean differs."""
    return 300.0 + 100.0 * ((np.asarray(t_ns) // 250_000_000) % 2)


@pytest.fixture
def emu() -> Iterator[Mcp39f511Emulator]:
    with running(Mcp39f511Emulator(wave_w, seed=3, shares=(0.75, 0.25))) as e:
        yield e


def run_for(acq: Mcp39f511Acquirer, seconds: float) -> list[Reading]:
    out: list[Reading] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out += acq.poll()
    return out


def rows(readings: list[Reading]) -> np.ndarray:
    return np.vstack([r.values for r in readings if isinstance(r, Chunk)])


@pytest.mark.system
def test_every_update_once_values_energy_and_restore(emu: Mcp39f511Emulator) -> None:
    acq = Mcp39f511Acquirer(emu.path)
    (desc,) = acq.open()
    names = desc.channel_names
    first_update, first_hidden = emu.updates, emu.updates_hidden
    readings = run_for(acq, 1.5)
    made = emu.updates - first_update - (emu.updates_hidden - first_hidden)  # could be seen
    values = rows(readings)
    lost = sum(r.samples_lost for r in readings if isinstance(r, Gap))
    # every update after the one found at open, once: none twice, none lost unreported
    assert made - 1 <= len(values) + lost and len(values) <= made
    assert len(values) >= 25  # 25 updates a second at N = 1 and 50 Hz
    total = values[:, names.index("power_total_w")]
    assert set(np.round(total, -2)) <= {300.0, 400.0} and np.ptp(total) > 50
    p1, p2 = values[:, names.index("power1_w")], values[:, names.index("power2_w")]
    assert np.allclose(p1 / total, 0.75, atol=0.01) and np.allclose(p2 / total, 0.25, atol=0.01)
    assert np.allclose(values[:, names.index("voltage_v")], 230.0)
    assert np.allclose(values[:, names.index("power_factor1")], 0.95, atol=1e-3)
    counted = values[-1, names.index("energy_import1_j")] + values[-1, names.index(
        "energy_import2_j")]
    # the chip's accumulators hold the updates a loaded host did not read too: each lost
    # update (reported in a gap) counts at the mean power, ± the 300/400 W waveform's half
    integrated = float(total.sum() + lost * total.mean()) * acq.interval_s
    assert counted == pytest.approx(
        integrated, abs=3 * 3.6 + 0.02 * integrated + lost * 50.0 * acq.interval_s)
    assert acq.energy_check() is None
    acq.close()
    assert emu.register(0xA8, "<H") == 4 and emu.register(0xA0, "<I") == 0  # as found


@pytest.mark.system
def test_faults_are_retried(emu: Mcp39f511Emulator) -> None:
    """NAK and a bad checksum cost a retry; a reply cut short costs the read timeout too."""
    acq = Mcp39f511Acquirer(emu.path)
    acq.open()
    for fault, most_lost in (("nak", 0), ("bad_checksum", 0), ("short", 2)):
        emu.inject(fault, 1)
        readings = run_for(acq, 0.3)
        assert len(rows(readings)) >= 4
        assert sum(r.samples_lost for r in readings if isinstance(r, Gap)) <= most_lost
    assert acq.retries == 3
    acq.close()


@pytest.mark.system
def test_a_stall_loses_updates_but_not_energy(emu: Mcp39f511Emulator) -> None:
    acq = Mcp39f511Acquirer(emu.path)
    (desc,) = acq.open()
    names = desc.channel_names
    before = rows(run_for(acq, 0.3))
    time.sleep(0.5)  # the host does not read: ~12 updates go unread
    readings = run_for(acq, 0.3)
    acq.close()
    # the stall is the first gap; a loaded machine may stall a later read too, and every
    # gap must report the updates its own unread time held (issue 34: loss reported = loss)
    gaps = [r for r in readings if isinstance(r, Gap)]
    gap = gaps[0]
    assert gap.samples_lost >= 9
    for g in gaps:
        unread_s = (g.t_last_ns - g.t_first_ns) / 1e9  # between the reads around it
        assert abs(g.samples_lost - (unread_s / acq.interval_s - 1)) <= 1, g
    after = rows(readings)
    e = names.index("energy_import1_j")
    bridged = after[0, e] - before[-1, e]  # energy across the gap, from the accumulator
    missing_s = (gap.samples_lost + 1) * acq.interval_s
    mean_w = float(np.mean(np.concatenate([before, after])[:, names.index("power1_w")]))
    assert bridged == pytest.approx(mean_w * missing_s, rel=0.25)
    assert bridged > 0.4 * 225.0  # far more than the one update the power channels kept


@pytest.mark.system
def test_sixty_hertz_mains_updates_every_two_cycles() -> None:
    with running(Mcp39f511Emulator(lambda t: 150.0, line_hz=60.0)) as emu:
        acq = Mcp39f511Acquirer(emu.path)
        (desc,) = acq.open()
        assert desc.config["update_interval_s"] == pytest.approx(2 / 60)
        values = rows(run_for(acq, 0.7))
        acq.close()
    assert len(values) >= 17


@pytest.mark.system
def test_devices_recognises_the_board(emu: Mcp39f511Emulator, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    assert main(["devices", "--probe", emu.path, "--json"]) == 0
    found = [d for d in json.loads(capsys.readouterr().out) if d["address"] == emu.path]
    assert found[0]["kind"] == "mcp39f511"
    assert found[0]["identity"] == "MCP39F511N system version 0x5A15"
    assert found[0]["meter_spec"] == f"mcp39f511:{emu.path}"


@pytest.mark.system
def test_record_with_meter_flag_and_energy_from_the_counters(emu: Mcp39f511Emulator,
                                                             tmp_path) -> None:
    out = tmp_path / "mcp.h5"
    code = main(["record", "--nvml", "none", "--duration", "1.5", "-o", str(out),
                 "--meter", f"wall=mcp39f511:{emu.path}"])
    assert_exit_matches_loss(code, out)
    with wattlab.open(str(out)) as run:
        view = run.source("wall")
        assert len(view) >= 30
        assert 300.0 <= float(np.mean(view.channel("power_total_w"))) <= 400.0
        report = energy_report(run)
    run_rows = {r["channel"]: r for r in report["rows"] if r["phase"] == "run"}
    counter = run_rows["energy_import1_j"]["energy_j"]
    assert counter == pytest.approx(run_rows["power1_w"]["energy_j"], rel=0.1)


@pytest.mark.system
def test_bench_file_with_rails(emu: Mcp39f511Emulator, tmp_path) -> None:
    bench = tmp_path / "bench.toml"
    bench.write_text(f'[[device]]\nkind = "mcp39f511"\nport = "{emu.path}"\n'
                     'rails = { 1 = "server_ac" }\n')
    out = tmp_path / "bench.h5"
    assert_exit_matches_loss(
        main(["record", "--bench", str(bench), "--duration", "1", "-o", str(out)]), out)
    with wattlab.open(str(out)) as run:
        view = run.source("mcp")
        assert "server_ac_power_w" in view.channel_names
        assert "server_ac_energy_import_j" in view.channel_names
        assert "power2_w" in view.channel_names  # the outlet not named keeps its name


@pytest.mark.fast
def test_bench_file_errors_name_the_key(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "bad.toml"
    bench.write_text('[[device]]\nkind = "mcp39f511"\nport = "/dev/x"\naccumulation_n = 12\n')
    assert main(["bench", "check", str(bench)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml:4" in err and "accumulation_n must be a whole number from 0 to 8" in err


@pytest.mark.system
def test_emulate_serves_the_board_until_ctrl_c() -> None:
    with emulator_cli([sys.executable, "-m", "wattlab.cli", "emulate", "mcp39f511"]) as (
            proc, line):
        path = line.strip()
        assert path.startswith("/dev/pts/")
        transport = SerialTransport(path, timeout_s=2.0)
        try:
            assert Mcp39f511(transport).system_version() == 0x5A15
        finally:
            transport.close()
        assert ctrl_c(proc, 20) == 130  # docs/cli.md: 130 after Ctrl-C
