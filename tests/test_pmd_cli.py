"""PMD-USB through the command line: recognised by `devices`, recorded with --meter."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wattlab
from tests.conftest import running
from wattlab.cli import main
from wattlab.hardware.emulators.pmd_emulator import PmdEmulator

pytestmark = pytest.mark.system


def test_devices_recognises_an_emulated_pmd(capsys):
    with running(PmdEmulator(lambda t: 150.0)) as emu:
        assert main(["devices", "--probe", emu.path, "--json"]) == 0
    found = [d for d in json.loads(capsys.readouterr().out) if d["address"] == emu.path]
    assert found[0]["kind"] == "pmd"
    assert found[0]["identity"] == "ElmorLabs PMD-USB"


def test_record_with_an_emulated_pmd(tmp_path):
    out = tmp_path / "pmd.h5"
    with running(PmdEmulator(lambda t: 240.0)) as emu:
        assert main(["record", "--nvml", "none", "--duration", "1.5", "-o", str(out),
                     "--meter", f"pmd:{emu.path}"]) == 0
    with wattlab.open(str(out)) as run:
        view = run.source("pmd")
        assert len(view) > 300
        assert abs(float(np.mean(view.channel("power_total_w"))) - 240.0) < 12.0
        assert run.gaps == []
