"""PMD-USB driver and acquirer against the emulator over a real pty and pyserial."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest

from tests.conftest import ctrl_c, emulator_cli, running
from wattlab.acquisition.acquirers.acquirer import Chunk, Reading
from wattlab.acquisition.acquirers.pmd_acquirer import PmdAcquirer
from wattlab.drivers.pmd import PmdUsb
from wattlab.drivers.transport import SerialTransport
from wattlab.errors import MeterError
from wattlab.hardware.emulators.pmd_emulator import DEFAULT_ADC_OFFSET, PmdEmulator
from wattlab.samples import Gap, SampleFlag

pytestmark = pytest.mark.system

FRAME_BYTES = 20  # 4 timestamp bytes + 8 channels


def wave_w(t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    return 250.0 + 100.0 * np.sin(2 * np.pi * 3.0 * t_ns / 1e9)


@pytest.fixture
def emu() -> Iterator[PmdEmulator]:
    with running(PmdEmulator(wave_w, seed=5)) as e:
        yield e


def open_driver(path: str) -> tuple[PmdUsb, SerialTransport]:
    # generous: the emulator thread shares the test's process and, in CI, two busy cores
    transport = SerialTransport(path, timeout_s=1.0)
    return PmdUsb(transport), transport


def run_for(acq: PmdAcquirer, seconds: float) -> list[Reading]:
    out: list[Reading] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        out += acq.poll()
    return out


def chunks(readings: list[Reading]) -> list[Chunk]:
    return [r for r in readings if isinstance(r, Chunk)]


@pytest.mark.parametrize("firmware", [5, 6])
def test_identify_product_and_config(firmware: int) -> None:
    with running(PmdEmulator(wave_w, firmware=firmware,
                             welcome_extra=b"\0" if firmware == 5 else b"")) as emu:
        pmd, transport = open_driver(emu.path)
        try:
            info = pmd.connect()
            assert info.welcome == "ElmorLabs PMD-USB"
            assert info.product.firmware == firmware
            assert info.config.adc_offset == DEFAULT_ADC_OFFSET
            assert len(info.config.adc_gain_offset) == (8 if firmware >= 6 else 0)
            assert pmd.identify() == "ElmorLabs PMD-USB"  # the trailing byte was not left over
        finally:
            transport.close()


def test_polled_readings_match_the_waveform(emu: PmdEmulator) -> None:
    pmd, transport = open_driver(emu.path)
    try:
        t0 = time.monotonic_ns()
        rails = pmd.read_readings()
        sensors = pmd.read_sensors()
        t1 = time.monotonic_ns()
    finally:
        transport.close()
    expected = wave_w(np.array([t0, t1]))
    total = sum(r.power_w for r in rails)
    # V to 10 mV and A to 0.1 A per rail, noise 0.03 A: a few W on ~250 W
    assert expected.min() - 4.0 <= total <= expected.max() + 4.0
    assert all(abs(r.voltage_v - 12.0) < 0.1 for r in rails)
    assert [s.name for s in sensors] == ["PCIE1", "PCIE2", "EPS1", "EPS2"]
    assert sensors[0].power_w == pytest.approx(0.4 * expected.mean(), abs=4.0)


def test_stream_rate_values_and_times(emu: PmdEmulator) -> None:
    acq = PmdAcquirer(emu.path)
    try:
        (desc,) = acq.open()
        t0 = time.monotonic()
        readings = run_for(acq, 0.3)
        elapsed = time.monotonic() - t0
    finally:
        acq.close()
    assert desc.time_raw == "device_ticks_3mhz" and desc.value_dtype == "<f4"
    assert desc.channel_names[:3] == ["pcie1_voltage_v", "pcie1_current_a", "pcie1_power_w"]
    assert desc.channel_names[-1] == "power_total_w" and len(desc.channels) == 13
    cs = chunks(readings)
    n = sum(c.values.shape[0] for c in cs)
    rate_hz = 115200 / 10 / FRAME_BYTES  # 576 frames/s: the line is the limit
    assert abs(n - elapsed * rate_hz) <= 0.15 * elapsed * rate_hz
    assert not any(isinstance(r, Gap) for r in readings)
    ticks = np.concatenate([c.t_raw for c in cs if c.t_raw is not None])
    steps = np.diff(ticks)
    assert np.all(np.abs(steps - 3e6 / rate_hz) <= 1)
    host = np.concatenate([c.t_host_ns for c in cs])
    assert np.all(np.diff(host) > 0)
    true_ns = emu.stream_started_ns + (ticks - ticks[0]) * 1000 // 3
    assert np.abs(host - true_ns).max() < 50_000_000
    values = np.concatenate([c.values for c in cs])
    assert values.dtype == np.float32
    err = np.abs(values[:, -1] - wave_w(true_ns))
    assert err.max() < 8.0  # 12-bit steps of 7.6 mV and 49 mA per rail, plus noise
    np.testing.assert_allclose(values[:, 0], 12.0, atol=0.1)


def test_baud_switch_speeds_up_the_stream(emu: PmdEmulator) -> None:
    acq = PmdAcquirer(emu.path, baud=2_000_000, baud_settle_s=0.01)
    try:
        (desc,) = acq.open()
        t0 = time.monotonic()
        readings = run_for(acq, 0.2)
        elapsed = time.monotonic() - t0
    finally:
        acq.close()
    assert emu.baud_history == [(2_000_000, 2, 0, 0)]
    assert desc.config["baud"] == 2_000_000
    n = sum(c.values.shape[0] for c in chunks(readings))
    assert n > 0.7 * elapsed * 2_000_000 / 10 / FRAME_BYTES


def test_dropped_and_corrupt_bytes_recovered_as_gaps(emu: PmdEmulator) -> None:
    acq = PmdAcquirer(emu.path)
    try:
        acq.open()
        readings = run_for(acq, 0.1)
        emu.inject_drop_bytes(7)
        readings += run_for(acq, 0.15)
        emu.inject_corrupt_bytes(5)
        readings += run_for(acq, 0.15)
    finally:
        acq.close()
    gaps = [r for r in readings if isinstance(r, Gap)]
    # drop 7: 13 bytes to the next frame + the frame before (its tail might be the loss)
    assert [g.reason for g in gaps] == ["resync: 33 bytes skipped", "resync: 25 bytes skipped"]
    flags = np.concatenate([c.flags for c in chunks(readings) if c.flags is not None])
    assert (flags & SampleFlag.RESYNC).astype(bool).sum() == 2
    assert acq.bytes_skipped == 58
    values = np.concatenate([c.values for c in chunks(readings)])
    np.testing.assert_allclose(values[:, 0], 12.0, atol=0.1)  # nothing misaligned got through


def test_disconnect_raises_meter_error_naming_port(emu: PmdEmulator) -> None:
    acq = PmdAcquirer(emu.path)
    try:
        acq.open()
        acq.poll()
        emu.disconnect()
        t0 = time.monotonic()
        with pytest.raises(MeterError, match=emu.path):
            for _ in range(20):
                acq.poll()
        assert time.monotonic() - t0 < 1.0
    finally:
        t0 = time.monotonic()
        acq.close()
        assert time.monotonic() - t0 < 1.0


def test_close_stops_continuous_mode(emu: PmdEmulator) -> None:
    acq = PmdAcquirer(emu.path)
    acq.open()
    acq.poll()
    acq.close()
    deadline = time.monotonic() + 1.0
    while emu.streaming and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not emu.streaming
    assert emu.commands[-1] == b"\x07\x00\x00\x00"
    assert emu.commands[:5] == [b"\x07\x00\x00\x00", b"\x00", b"\x01", b"\x04",
                                b"\x07\x01\x04\xff"]


def test_emulator_cli_prints_port_and_stops_on_ctrl_c() -> None:
    code = "from wattlab.hardware.emulators.pmd_emulator import main; raise SystemExit(main([]))"
    with emulator_cli([sys.executable, "-c", code]) as (proc, line):
        path = line.strip()
        assert path.startswith("/dev/pts/")
        t = SerialTransport(path, timeout_s=2.0)
        try:
            t.write(b"\x00")
            assert t.read(17) == b"ElmorLabs PMD-USB"
        finally:
            t.close()
        assert ctrl_c(proc, 5) == 0
