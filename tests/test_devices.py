"""`wattlab devices`: recognising meters by a safe identify query over real ptys."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import running
from wattlab.acquisition.meters.discovery import identify_serial
from wattlab.cli import main
from wattlab.hardware.emulators.powersensor3_emulator import PowerSensor3Emulator


@pytest.mark.system
def test_probe_recognises_an_emulated_powersensor3(capsys):
    with running(PowerSensor3Emulator(lambda t: 100.0)) as emu:
        assert main(["devices", "--probe", emu.path, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    ps3 = [d for d in found if d["address"] == emu.path]
    assert ps3 and ps3[0]["kind"] == "powersensor3"
    assert ps3[0]["identity"].startswith("F411")
    assert ps3[0]["meter_spec"] == f"powersensor3:{emu.path}"
    assert any(d["kind"] == "nvml" for d in found)


@pytest.mark.system
def test_a_silent_port_is_reported_as_unknown_not_guessed():
    master, slave = os.openpty()
    try:
        device = identify_serial(os.ttyname(slave))
    finally:
        os.close(master)
        os.close(slave)
    assert device.kind == "serial"
    assert any("not a powersensor3" in n for n in device.notes)
    assert any("not a pmd" in n for n in device.notes)


@pytest.mark.fast
def test_a_missing_port_is_named(capsys):
    device = identify_serial("/dev/no-such-tty")
    assert device.kind == "serial"
    assert "/dev/no-such-tty" in device.notes[0]
