"""HMC8015 driver ↔ emulator through real pyvisa-py over TCP on 127.0.0.1."""

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import running, timed
from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.acquirers.scpi_acquirers import Hmc8015Acquirer
from wattlab.drivers.hmc8015 import Hmc8015
from wattlab.drivers.scpi import ScpiError, ScpiTransport
from wattlab.errors import MeterError, MeterTimeoutError
from wattlab.hardware.emulators.hmc8015_emulator import UPDATE_NS, Hmc8015Emulator
from wattlab.samples import SampleFlag

pytestmark = pytest.mark.system


def steady_w(t_ns: int) -> float:
    return 300.0


@pytest.fixture
def emu() -> Iterator[Hmc8015Emulator]:
    with running(Hmc8015Emulator(steady_w)) as device:
        yield device


@pytest.fixture
def meter(emu: Hmc8015Emulator, rm: Any) -> Iterator[Hmc8015]:
    driver = Hmc8015(ScpiTransport(emu.resource, rm))
    driver.connect()
    yield driver
    driver.close()


def test_functions_and_auto_range(meter: Hmc8015, emu: Hmc8015Emulator) -> None:
    meter.auto_range()
    assert emu.volt_auto and emu.curr_auto
    meter.set_functions(["URMS", "IRMS", "P", "LAMB"])
    (u, i, p, pf), flags = meter.read_values()
    assert 229 < u < 231 and pf == pytest.approx(0.98)
    assert 450 / 0.95 < p < 450 / 0.89 and i == pytest.approx(p / (u * pf), rel=1e-3)
    assert not flags.any()


def test_integrator_energy_and_conflict(meter: Hmc8015, emu: Hmc8015Emulator) -> None:
    meter.set_functions(["P", "WH", "TIME"])
    meter.integration_mode = "MAN"
    meter.integration_reset()
    start = timed(meter.integration_start)
    with pytest.raises(ScpiError) as info:
        meter.integration_mode = "DUR"
    assert info.value.code == -221
    time.sleep(0.5)
    stop = timed(meter.integration_stop)
    p_w, energy_j, time_s = meter.read_values()[0]
    # the integrator counts whole 100 ms updates: one more or less than the span it ran
    update_s = UPDATE_NS / 1e9
    assert stop[0] - start[1] - update_s <= time_s <= stop[1] - start[0] + update_s
    assert time_s >= 0.5 - update_s
    assert energy_j == pytest.approx(p_w * time_s, rel=0.01)


def test_log_round_trip(meter: Hmc8015, emu: Hmc8015Emulator) -> None:
    meter.set_functions(["URMS", "P", "WH"])
    meter.log_mode = "UNL"
    meter.log_interval_s = 0.1
    meter.log_file("bench1")
    start = timed(meter.log_start)
    time.sleep(0.55)
    stop = timed(meter.log_stop)
    assert meter.list_logs() == ["BENCH1.CSV"]
    log = meter.read_log("bench1.CSV")
    assert log.functions == ["URMS", "P", "WH"]
    # one row per whole 0.1 s the log ran: at least 5 in the 0.55 s asked for
    rows = len(log.time_of_day_s)
    assert 5 <= int((stop[0] - start[1]) / 0.1) <= rows <= int((stop[1] - start[0]) / 0.1)
    assert np.allclose(np.diff(log.time_of_day_s), 0.1, atol=0.002)
    assert np.all((log.values[:, 1] > 450 / 0.95) & (log.values[:, 1] < 450 / 0.89))
    assert log.metadata["Device"] == "HMC8015"
    with pytest.raises(ScpiError, match="-256"):
        meter.download_log("missing.CSV")


def test_acquirer_reads_fresh_values(emu: Hmc8015Emulator, rm: Any) -> None:
    acq = Hmc8015Acquirer(emu.resource, rate_s=0.1, resource_manager=rm)
    (desc,) = acq.open()
    assert desc.serial == "021EMU0001" and desc.firmware == "01.400"
    try:
        chunks: list[Chunk] = []
        t_end = time.monotonic() + 0.55
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            chunks += [c for c in acq.poll() if isinstance(c, Chunk)]
            assert time.monotonic() - t0 < 0.2
        emu.inject_bad_value("overrange")
        after: list[Chunk] = []
        while not after:
            after = [c for c in acq.poll() if isinstance(c, Chunk)]
        bad = after[0]
    finally:
        acq.close()
    assert 4 <= len(chunks) <= 7
    assert isinstance(bad, Chunk) and bad.flags is not None
    assert np.isnan(bad.values).all() and bad.flags[0] & SampleFlag.OVERRANGE


def test_timeout_and_wrong_model(emu: Hmc8015Emulator, rm: Any) -> None:
    t = ScpiTransport(emu.resource, rm, timeout_ms=200)
    try:
        emu.stall(0.6)
        with pytest.raises(MeterTimeoutError, match=emu.resource.replace(".", r"\.")):
            Hmc8015(t).connect()
    finally:
        t.close()
    emu.set_idn("Rohde&Schwarz,HMC8012,1,1")
    t = ScpiTransport(emu.resource, rm)
    try:
        with pytest.raises(MeterError, match="expected a HMC8015, got 'HMC8012'"):
            Hmc8015(t).connect()
    finally:
        t.close()
