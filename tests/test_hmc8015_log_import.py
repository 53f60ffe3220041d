"""An unattended HMC8015 log, fetched from the (emulated) instrument, imported as a run."""

from __future__ import annotations

import time

import numpy as np
import pytest

import wattlab
from tests.conftest import running, timed
from wattlab.cli import main
from wattlab.drivers.hmc8015 import Hmc8015
from wattlab.drivers.scpi import ScpiTransport
from wattlab.hardware.emulators.hmc8015_emulator import Hmc8015Emulator


@pytest.mark.system
def test_on_device_log_imports_into_a_run_file(tmp_path, capsys):
    with running(Hmc8015Emulator(lambda t: 300.0)) as emu:
        meter = Hmc8015(ScpiTransport(emu.resource))
        try:
            meter.connect()
            meter.set_functions(["URMS", "P", "WH"])
            meter.log_interval_s = 0.1
            meter.log_file("night")
            start = timed(meter.log_start)
            time.sleep(0.45)
            stop = timed(meter.log_stop)
            data = meter.download_log("NIGHT.CSV")
        finally:
            meter.close()
    log_path = tmp_path / "NIGHT.CSV"
    log_path.write_bytes(data)
    out = tmp_path / "night.h5"
    assert main(["import", "hmc8015-log", str(log_path), "-o", str(out)]) == 0
    with wattlab.open(str(out)) as run:
        view = run.source("NIGHT")
        assert view.kind == "hmc8015"
        assert view.units == ["V", "W", "J"]
        # one row per whole 0.1 s the log ran (by when the commands ran: load delays the stop)
        assert 4 <= int((stop[0] - start[1]) / 0.1) <= len(view) <= int(
            (stop[1] - start[0]) / 0.1)
        assert np.allclose(np.diff(view.time_ns) / 1e9, 0.1, atol=0.002)
        assert view.descriptor["time_raw"] == "unix_ns"
        assert abs(view.time_raw[0] / 1e9 - time.time()) < 3600 * 24


@pytest.mark.fast
def test_a_broken_log_is_refused_with_its_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("#Device;HMC8015\nTime;P[W]\n12:00:00.000;12.5\nnot a time;1\n")
    assert main(["import", "hmc8015-log", str(bad), "-o", str(tmp_path / "x.h5")]) == 2
    assert "line 4" in capsys.readouterr().err
    assert not (tmp_path / "x.h5").exists()
