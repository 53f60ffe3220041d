"""wattlab.testing, the driver-test helpers wattlab ships: each failure they report, and
the pytest plugin as an installed wattlab brings it.

Each check that a helper fails is made with ``pytest.raises`` around it, so a helper that
stopped failing fails here. The plugin is run the way a plugin package's tests meet it: a
pytest subprocess finds it through the ``pytest11`` entry point written from this
project's ``pyproject.toml``, runs the examples of docs/testing-drivers.md, and reports the
failures a script left unfinished causes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.toy_meter.toy_driver import ToyMeter
from wattlab.drivers.pmd import PmdUsb
from wattlab.drivers.powersensor3 import PowerSensor3
from wattlab.drivers.scpi import encode_definite_block
from wattlab.drivers.yokogawa_wt300e import Wt300e
from wattlab.errors import MeterProtocolError, MeterTimeoutError
from wattlab.testing import (
    ExpectedProtocol,
    ScriptedTextTransport,
    expected_protocol,
    expected_scpi,
)

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "testing-drivers.md"
VERSION = (b"V", b"F411-1.6.1\r\n")
COUNTER = (b"Q", b"\x10\x27\x00\x80")


def fails(error: type[BaseException], message: str) -> AbstractContextManager[object]:
    return pytest.raises(error, match=re.escape(message))


@pytest.mark.fast
@pytest.mark.fast
def test_a_driver_test_is_three_lines() -> None:
    with expected_protocol(PowerSensor3, [VERSION, COUNTER]) as ps:
        assert (ps.read_version(), ps.read_counter()) == ("F411-1.6.1", 0x80002710)


@pytest.mark.fast
@pytest.mark.fast
def test_a_wrong_write_names_the_exchange_and_both_byte_strings() -> None:
    with (
        fails(AssertionError, "exchange 1: driver wrote b'I', expected b'Q'"),
        expected_protocol(PowerSensor3, [VERSION, COUNTER]) as ps,
    ):
        ps.read_version()
        ps.read_single_frame()
    port = ExpectedProtocol([(b"ABC", b"")])
    port.write(b"AB")
    with fails(AssertionError, "exchange 0: driver wrote b'X', expected b'C' (the rest of b'ABC')"):
        port.write(b"X")
    assert port.written == [b"AB", b"X"]


@pytest.mark.fast
@pytest.mark.fast
def test_a_write_after_the_script_fails() -> None:
    with (
        fails(AssertionError, "driver wrote b'T' after the script ended (2 exchange(s), all made)"),
        expected_protocol(PowerSensor3, [(b"S", b""), (b"M", b"")]) as ps,
    ):
        ps.start()
        ps.mark()
        ps.stop()


@pytest.mark.fast
@pytest.mark.fast
def test_an_unfinished_script_fails_at_the_end_naming_what_is_left() -> None:
    with (
        fails(AssertionError, "script not finished: exchange 1 of 3 never made: (b'S', b'') "
                              "and 1 more"),
        expected_protocol(PowerSensor3, [VERSION, (b"S", b""), (b"T", b"")]) as ps,
    ):
        ps.read_version()
    with (
        fails(AssertionError, r"script not finished: 2 reply bytes never read: b'\xff\xff'"),
        expected_protocol(PowerSensor3, [(b"Q", COUNTER[1] + b"\xff\xff")]) as ps,
    ):
        ps.read_counter()
    port = ExpectedProtocol([(b"ABC", b"")])
    port.write(b"AB")
    with fails(AssertionError, "exchange 0 of 1 never made, 2 bytes of it written: (b'ABC', b'')"):
        port.assert_consumed()


@pytest.mark.fast
@pytest.mark.fast
def test_a_read_past_the_script_is_a_timeout_as_on_a_silent_port() -> None:
    with (
        fails(MeterTimeoutError, "scripted port: driver read 4 bytes, the instrument sent 2 "
                                 "and the script has ended"),
        expected_protocol(PowerSensor3, [(b"Q", b"\x10\x27")]) as ps,
    ):
        ps.read_counter()
    port = ExpectedProtocol([(b"Q", b"\x10"), (b"V", b"F4\n")])
    port.write(b"Q")
    with fails(MeterTimeoutError, "driver read 2 bytes, the instrument sent 1 until exchange 1 "
                                  "(b'V') is written"):
        port.read(2)


@pytest.mark.fast
@pytest.mark.fast
def test_unprompted_bytes_arrive_before_and_between_exchanges() -> None:
    port = ExpectedProtocol([(None, b"BOOT\n"), (b"S", b""), (None, b"abc"), (None, b"def")])
    assert port.read_available(64) == b"BOOT\n"
    assert port.read_available(64) == b""
    port.write(b"S")
    assert port.read(6) == b"abcdef"
    port.assert_consumed()
    frame = bytes.fromhex("fa65 8840 9000 a000 b42c c000 d000 e000 f000")
    with expected_protocol(PowerSensor3, [(b"S", b""), (None, frame * 3)]) as ps:
        ps.start()
        assert ps.read_stream().n == 3
    junk = (None, b"\x00\x07left by another program")  # the toy drops it before asking
    with expected_protocol(ToyMeter, [junk, (b"*IDN?\n", b"TOY,METER,0001,1.0\n")]) as toy:
        assert toy.identify() == "TOY,METER,0001,1.0"
    with fails(ValueError, "exchange 0: an empty write matches nothing"):
        ExpectedProtocol([(b"", b"x")])


@pytest.mark.fast
@pytest.mark.fast
def test_an_error_in_the_block_is_the_outcome_and_the_script_is_not_checked() -> None:
    with (
        fails(MeterProtocolError, "version reply is not text"),
        expected_protocol(PowerSensor3, [(b"V", b"\x01\n"), COUNTER]) as ps,
    ):
        ps.read_version()


@pytest.mark.fast
@pytest.mark.fast
def test_driver_arguments_and_a_ready_port_pass_through() -> None:
    port = ExpectedProtocol([(b"\x01", b"\xee\x0a\x06")])
    slept: list[float] = []
    with expected_protocol(PmdUsb, port, name="/dev/ttyUSB9", sleep=slept.append) as pmd:
        assert pmd.read_product().firmware == 6
    assert pmd.transport is port and pmd.port == "/dev/ttyUSB9" and pmd.sleep == slept.append


RATE_AFTER_STATE = [(":INTEG:STAT?", "START"), (":RATE?", "0.1")]


@pytest.mark.fast
@pytest.mark.fast
def test_a_scpi_script_names_the_exchange_and_what_the_driver_did() -> None:
    with (
        fails(AssertionError, "exchange 1: driver sent ':INTEG:STAT?' (query), "
                              "expected ':RATE?'"),
        expected_scpi(Wt300e, RATE_AFTER_STATE) as meter,
    ):
        meter.integration_state()
        meter.integration_state()
    with (
        fails(AssertionError, "script not finished: exchange 1 of 2 never made: "
                              "(':RATE?', '0.1')"),
        expected_scpi(Wt300e, RATE_AFTER_STATE) as meter,
    ):
        meter.integration_state()
    with (
        fails(AssertionError, "exchange 0: ':INTEG:STAR' was written but the script has a "
                              "reply 'OK'"),
        expected_scpi(Wt300e, [(":INTEG:STAR", "OK")]) as meter,
    ):
        meter.integration_start()
    with (
        fails(AssertionError, "exchange 0: ':INTEG:STAT?' was queried but the script has "
                              "reply None"),
        expected_scpi(Wt300e, [(":INTEG:STAT?", None)]) as meter,
    ):
        meter.integration_state()
    with (
        fails(AssertionError, "driver sent ':INTEG:STAT?' (query) after the script ended "
                              "(0 exchange(s), all made)"),
        expected_scpi(Wt300e, []) as meter,
    ):
        meter.integration_state()


@pytest.mark.fast
@pytest.mark.fast
def test_a_scpi_script_raises_and_answers_blocks() -> None:
    with (
        expected_scpi(Wt300e, [(":INTEG:STAT?", MeterTimeoutError("X: no reply"))]) as meter,
        fails(MeterTimeoutError, "X: no reply"),
    ):
        meter.integration_state()
    instrument = ScriptedTextTransport([("DATA?", encode_definite_block(b"1;2") + b"\n")],
                                       "USB0::1::INSTR")
    assert instrument.query_binary_block("DATA?") == b"1;2"
    instrument.assert_consumed()
    assert instrument.sent == ["DATA?"]


@pytest.mark.fast
@pytest.mark.fast
def test_wattlabs_own_tests_have_the_fixtures(request: pytest.FixtureRequest) -> None:
    build = request.getfixturevalue("expected_scpi")
    assert build(Wt300e, [(":INTEG:STAT?", "STOP")]).integration_state() == "stop"
    assert request.config.pluginmanager.has_plugin("wattlab")


@pytest.mark.system
@pytest.mark.system
def test_importing_the_helpers_or_the_plugin_loads_no_pytest_and_no_driver() -> None:
    probe = ("import sys\n"
             "import wattlab.testing.pytest_plugin\n"
             "print(sorted(m for m in sys.modules if m.startswith('wattlab.drivers')))\n"
             "sys.modules.pop('pytest'); sys.modules.pop('_pytest')\n"
             "[sys.modules.pop(m) for m in list(sys.modules) if m.startswith(('pytest', "
             "'_pytest'))]\n"
             "from wattlab.testing import expected_protocol, expected_scpi\n"
             "print(sorted(m for m in sys.modules if m.startswith(('pytest', '_pytest'))))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=False, env=child_env([]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]"]


# ------------------------------------------- the plugin, found through its entry point


def child_env(paths: list[Path]) -> dict[str, str]:
    """This environment, without the pytest settings of the run that calls it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")
           and not k.startswith("PYTEST_XDIST")}
    src = Path(__import__("wattlab").__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [src, *paths])
    return env


def install_entry_points(site: Path) -> None:
    """What ``pip install wattlab`` leaves for pytest to find: a ``.dist-info`` with the
    ``pytest11`` lines of pyproject.toml (and the toy meter, a plugin's driver)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = [f"{key} = {value}" for key, value in project["entry-points"]["pytest11"].items()]
    dist = site / "wattlab_entry_points-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: wattlab-entry-points\n"
                                   "Version: 0\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text("\n".join(["[pytest11]", *lines, ""]),
                                           encoding="utf-8")
    shutil.copytree(ROOT / "tests" / "toy_meter", site / "toy_meter",
                    ignore=shutil.ignore_patterns("__pycache__"))


def guide_tests() -> list[str]:
    """The page's examples that are whole test modules."""
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.S | re.M)
    return [b for b in blocks if "\ndef test_" in b]


UNFINISHED = '''
from toy_meter.toy_driver import ToyMeter


def test_a_script_left_unfinished(expected_protocol):
    toy = expected_protocol(ToyMeter, [(b"READ?\\n", b"1,12.0,1.0\\n"), (b"READ?\\n", b"")])
    toy.read()


def test_a_test_that_fails_on_its_own(expected_scpi):
    from wattlab.drivers.yokogawa_wt300e import Wt300e

    meter = expected_scpi(Wt300e, [(":INTEG:STAT?", "STOP"), (":RATE?", "0.1")])
    assert meter.integration_state() == "start"


def test_a_test_without_the_fixtures():
    assert True
'''


@pytest.mark.system
@pytest.mark.system
def test_the_plugin_from_its_entry_point_runs_the_guide_and_fails_what_it_should(
        tmp_path: Path) -> None:
    site, project = tmp_path / "site", tmp_path / "project"
    install_entry_points(site)
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    examples = guide_tests()
    assert len(examples) >= 5, "the guide's examples went missing"
    for n, example in enumerate(examples):
        (project / f"test_guide_{n}.py").write_text(example, encoding="utf-8")
    (project / "test_failing.py").write_text(UNFINISHED, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "."],
                          cwd=project, capture_output=True, text=True, timeout=100,
                          check=False, env={**child_env([site]), "COLUMNS": "400"})
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    # the plugin came from an entry point: this one, or the installed wattlab's own where the
    # test command's install already made it (pytest loads one per plugin name)
    assert re.search(r"^plugins: .*\bwattlab-(entry-points-0|\d)", out, re.M), out
    passed = set(re.findall(r"^PASSED (\S+)", out, re.M))
    failed = dict(re.findall(r"^FAILED (\S+) - (.*)$", out, re.M))
    assert len(passed) == len(examples) + 1, out
    assert "test_failing.py::test_a_test_without_the_fixtures" in passed
    assert failed == {
        "test_failing.py::test_a_script_left_unfinished": (
            "AssertionError: script not finished: exchange 1 of 2 never made: "
            "(b'READ?\\n', b'')"),
        "test_failing.py::test_a_test_that_fails_on_its_own": (
            "AssertionError: assert 'stop' == 'start'"),
    }, out
    assert "ERROR" not in out and "warnings summary" not in out, out
