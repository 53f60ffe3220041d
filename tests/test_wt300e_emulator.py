"""WT300E driver ↔ emulator through real pyvisa-py over TCP on 127.0.0.1."""

import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import running
from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.acquirers.scpi_acquirers import Wt300eAcquirer
from wattlab.drivers.scpi import ScpiError, ScpiTransport
from wattlab.drivers.yokogawa_wt300e import Wt300e
from wattlab.errors import MeterError, MeterTimeoutError
from wattlab.hardware.emulators.wt300e_emulator import Wt300eEmulator
from wattlab.samples import SampleFlag

pytestmark = pytest.mark.system


def ramp_w(t_ns: int) -> float:
    return 400.0 + 50.0 * math.sin(t_ns / 3e8)


@pytest.fixture
def emu() -> Iterator[Wt300eEmulator]:
    with running(Wt300eEmulator("WT310E", ramp_w)) as device:
        yield device


@pytest.fixture
def meter(emu: Wt300eEmulator, rm: Any) -> Iterator[Wt300e]:
    driver = Wt300e(ScpiTransport(emu.resource, rm, timeout_ms=2000), "WT310E")
    driver.connect()
    yield driver
    driver.close()


def test_init_configures_the_emulator(meter: Wt300e, emu: Wt300eEmulator) -> None:
    assert meter.identity is not None and meter.identity.model == "WT310E"
    assert emu.qmes and emu.verbose and not emu.header and emu.filter1 == "FALL"
    meter.update_rate_s = 0.5
    assert meter.update_rate_s == pytest.approx(0.5)
    assert emu.rate_s == 0.5


def test_readings_are_plausible_wall_power(meter: Wt300e) -> None:
    meter.select_items([("U", 1), ("I", 1), ("P", 1), ("LAMB", 1)])
    values, flags = meter.read_values()
    u, i, p, pf = values
    assert 225 < u < 235 and 0.97 < pf < 0.99
    # 350-450 W of DC plus 150 W through a 0.90-0.94 efficient supply.
    assert 500 / 0.95 < p < 600 / 0.89
    assert i == pytest.approx(p / (u * pf), rel=1e-3)
    assert not flags.any()


def test_every_update_captured_once_at_100ms(emu: Wt300eEmulator, rm: Any) -> None:
    acq = Wt300eAcquirer(emu.resource, rate_s=0.1, resource_manager=rm, model="WT310E")
    acq.open()
    try:
        updates_before = emu.updates
        chunks: list[Chunk] = []
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            out = acq.poll()
            # one update's wait and four round trips to an emulator in this process: 0.1 s
            # and a few ms, with headroom for a starved 2-core CI machine
            assert time.monotonic() - t0 < 0.5
            chunks += [c for c in out if isinstance(c, Chunk)]
        updates = emu.updates - updates_before
    finally:
        acq.close()
    assert 9 <= len(chunks) <= 11
    assert len(chunks) >= updates - 1  # the update in flight at the end may be missed
    times = np.array([c.t_host_ns[0] for c in chunks])
    gaps_s = np.diff(times) / 1e9
    assert np.all(gaps_s > 0.05) and np.all(gaps_s < 0.15)
    powers = [c.values[0, 2] for c in chunks]
    assert len(set(powers)) == len(powers)  # no update read twice


def test_slow_rate_poll_stays_short(emu: Wt300eEmulator, rm: Any) -> None:
    acq = Wt300eAcquirer(emu.resource, rate_s=0.5, resource_manager=rm)
    acq.open()
    try:
        got = 0
        t_end = time.monotonic() + 1.2
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            got += sum(isinstance(c, Chunk) for c in acq.poll())
            # the first wait may take up to a whole period; later ones start near the update
            # (0.1 s before it: under the 0.5 s a wait from just after an update would take)
            assert time.monotonic() - t0 < (0.6 if got <= 1 else 0.4)
    finally:
        acq.close()
    assert 2 <= got <= 3


def test_integration_energy_matches_mean_power(meter: Wt300e, emu: Wt300eEmulator) -> None:
    meter.update_rate_s = 0.1
    meter.select_items([("P", 1), ("WH", 1), ("TIME", 1)])
    meter.integration_mode = "NORM"
    meter.integration_timer_s = 0
    meter.integration_reset()
    meter.clear_update_event()
    meter.integration_start()
    assert meter.integration_state() == "start"
    powers = []
    for _ in range(6):
        meter.wait_update()
        powers.append(meter.read_values()[0][0])
    meter.integration_stop()
    assert meter.integration_state() == "stop"
    _, energy_j, time_s = meter.read_values()[0]
    assert time_s == pytest.approx(0.6, abs=0.21)
    assert energy_j == pytest.approx(np.mean(powers) * time_s, rel=0.03)
    held = meter.read_values()[0][1]
    assert held == energy_j
    meter.integration_reset()
    assert meter.integration_state() == "reset"
    assert meter.read_values()[0][1] == 0.0


def test_integration_timer_runs_out(meter: Wt300e, emu: Wt300eEmulator) -> None:
    meter.update_rate_s = 0.1
    meter.integration_timer_s = 1
    meter.integration_start()
    emu.advance(time.monotonic_ns() + 2_000_000_000)
    assert meter.integration_state() == "timeup"
    meter.select_items([("TIME", 1)])
    assert meter.read_values()[0][0] == pytest.approx(1.0)


def test_setting_during_integration_raises_813(meter: Wt300e) -> None:
    meter.integration_start()
    with pytest.raises(ScpiError) as info:
        meter.update_rate_s = 0.25
    assert info.value.code == 813 and "integration" in info.value.message
    with pytest.raises(ScpiError, match="813"):
        meter.integration_reset()
    meter.integration_stop()
    meter.update_rate_s = 0.25  # allowed again once stopped


def test_injected_error_and_bad_values(meter: Wt300e, emu: Wt300eEmulator) -> None:
    meter.select_items([("U", 1), ("P", 1)])
    for kind, flag in (("nan", SampleFlag.NO_DATA), ("no_data", SampleFlag.NO_DATA),
                       ("overrange", SampleFlag.OVERRANGE)):
        emu.inject_bad_value(kind)
        values, flags = meter.read_values()
        assert np.isnan(values).all() and (flags == flag).all()
    emu.inject_bad_value("malformed")
    with pytest.raises(MeterError, match=r"1\.2\.3E\+00"):
        meter.read_values()
    emu.inject_error(999, "Something odd")
    with pytest.raises(ScpiError) as info:
        meter.integration_stop()
    assert info.value.code == 999 and info.value.message == "Something odd"


def test_unknown_command_reported_by_error_queue(meter: Wt300e) -> None:
    with pytest.raises(ScpiError) as info:
        meter.apply(":BOGUS:CMD 1")
    assert info.value.code == 113


def test_visa_timeout_names_the_resource(emu: Wt300eEmulator, rm: Any) -> None:
    transport = ScpiTransport(emu.resource, rm, timeout_ms=200)
    try:
        emu.stall(1.0)
        with pytest.raises(MeterTimeoutError) as info:
            Wt300e(transport).connect()
        assert emu.resource in str(info.value) and "*IDN?" in str(info.value)
    finally:
        transport.close()


def test_wrong_model_is_meter_error(emu: Wt300eEmulator, rm: Any) -> None:
    emu.set_idn("YOKOGAWA,WT333E,C3X,F1.04")
    transport = ScpiTransport(emu.resource, rm)
    try:
        with pytest.raises(MeterError, match="expected a WT310E, got 'WT333E'"):
            Wt300e(transport, "WT310E").connect()
    finally:
        transport.close()


def test_cannot_open_missing_resource(rm: Any) -> None:
    # pyvisa-py connects lazily: the refusal shows on first use, named either way.
    with pytest.raises(MeterError, match=r"TCPIP::127\.0\.0\.1::1::SOCKET"):
        transport = ScpiTransport("TCPIP::127.0.0.1::1::SOCKET", rm, timeout_ms=500)
        try:
            transport.query("*IDN?")
        finally:
            transport.close()


def test_sample_rate_alias_and_three_element_model(rm: Any) -> None:
    with running(Wt300eEmulator("WT333E", ramp_w)) as emu:
        t = ScpiTransport(emu.resource, rm)
        try:
            meter = Wt300e(t)
            meter.connect()
            t.write(":SAMP:RATE 250MS")
            meter.check_errors(":SAMP:RATE 250MS")
            assert meter.update_rate_s == pytest.approx(0.25)
            meter.select_items([("P", 1), ("P", 2), ("P", 3), ("P", "SIGMA")])
            p1, p2, p3, total = meter.read_values()[0]
            assert p1 + p2 + p3 == pytest.approx(total, rel=1e-3)  # NR3 keeps 5 digits
        finally:
            t.close()


def test_close_releases_a_connection_held_in_wait() -> None:
    import socket

    with running(Wt300eEmulator("WT310E", ramp_w)) as emu:
        client = socket.create_connection(("127.0.0.1", int(emu.resource.split("::")[2])))
        try:
            client.sendall(b":STAT:FILT1 FALL;:RATE 5;:STAT:EESR?\n")
            assert client.recv(100).strip().isdigit()
            client.sendall(b":COMM:WAIT 1\n")
            time.sleep(0.05)
            t0 = time.monotonic()
            emu.close()
            assert time.monotonic() - t0 < 0.5
        finally:
            client.close()
