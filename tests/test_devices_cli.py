"""`wattlab devices --network`: what the VISA discovery could not do is one note, not a warning."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from wattlab.acquisition.meters.discovery import quiet_visa_listing

WATTLAB = [sys.executable, "-m", "wattlab.cli"]
DISCOVERY_TIMEOUT_S = 60.0


@pytest.mark.fast
def test_a_listing_that_warns_gives_its_names_and_one_note_per_warning() -> None:
    def listing() -> list[str]:
        warnings.warn("TCPIP::hislip resource discovery requires the zeroconf package to\n"
                      "be installed... try 'pip install zeroconf'", UserWarning, stacklevel=1)
        warnings.warn("TCPIP::hislip resource discovery requires the zeroconf package to\n"
                      "be installed... try 'pip install zeroconf'", UserWarning, stacklevel=1)
        warnings.warn("unclosed <socket.socket fd=3>", ResourceWarning, stacklevel=1)
        return ["TCPIP::10.0.0.5::INSTR"]

    names, notes = quiet_visa_listing(listing)
    assert names == ["TCPIP::10.0.0.5::INSTR"]
    assert notes == ["network discovery incomplete: TCPIP::hislip resource discovery requires "
                     "the zeroconf package to be installed... try 'pip install zeroconf'"]


@pytest.mark.system
def test_devices_network_prints_no_python_warning() -> None:
    done = subprocess.run([*WATTLAB, "devices", "--network", "--json"], capture_output=True,
                          text=True, timeout=DISCOVERY_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "warnings.warn" not in done.stderr, done.stderr
    notes = [n for d in json.loads(done.stdout) if d["kind"] == "visa" for n in d["notes"]]
    assert all("\n" not in n for n in notes)
