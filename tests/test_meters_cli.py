"""Meters on the command line: --meter specs, record through the emulators, `emulate`."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pynvml
import pytest

import wattlab
from tests.conftest import assert_exit_matches_loss, ctrl_c, emulator_cli, running
from wattlab.acquisition.meters.meter_specs import meter_acquirers, parse_meter_spec
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.hardware.emulators.powersensor3_emulator import PowerSensor3Emulator
from wattlab.hardware.emulators.wt300e_emulator import Wt300eEmulator


@pytest.mark.fast
def test_meter_specs_parse_with_ids_aliases_and_visa_colons():
    spec = parse_meter_spec("wall=wt310e:TCPIP::127.0.0.1::5025::SOCKET")
    assert (spec.source_id, spec.kind, spec.address) == (
        "wall", "wt300e", "TCPIP::127.0.0.1::5025::SOCKET")
    assert parse_meter_spec("ps3:/dev/ttyACM0").source_id == "ps3"
    assert parse_meter_spec("riser=powersensor3:/dev/ttyACM1").kind == "powersensor3"


@pytest.mark.fast
@pytest.mark.parametrize(
    ("text", "message"),
    [("powersensor3", r"expected \[ID=\]KIND:ADDRESS"), ("geiger:/dev/x", "unknown meter kind"),
     ("bad id=ps3:/dev/x", "not valid")],
)
def test_bad_meter_specs_are_usage_errors(text, message):
    with pytest.raises(UsageError, match=message):
        parse_meter_spec(text)


@pytest.mark.fast
def test_duplicate_stream_ids_are_refused():
    with pytest.raises(UsageError, match="used twice"):
        meter_acquirers(["ps3:/dev/a", "ps3:/dev/b"])


@pytest.mark.system
def test_record_with_emulated_meters_keeps_every_stream(tmp_path):
    out = tmp_path / "bench.h5"
    with running(PowerSensor3Emulator(lambda t: 300.0)) as ps3, \
            running(Wt300eEmulator("WT310E")) as wall:
        code = main(["record", "--simulate", "--duration", "1.5", "-o", str(out),
                     "--meter", f"ps3:{ps3.path}", "--meter", f"wall=wt310e:{wall.resource}"])
    assert_exit_matches_loss(code, out)  # frames a loaded machine lost: reported, exit 1
    with wattlab.open(str(out)) as run:
        riser = run.source("ps3")
        lost = sum(g.samples_lost for g in run.gaps if g.source == "ps3")
        rate = (len(riser) + lost - 1) / (np.ptp(riser.time_ns) / 1e9)  # rows + lost ones
        assert 19_000 < rate < 21_000
        assert abs(np.mean(riser.channel("power_total_w")) - 300.0) < 5.0
        assert run.source("wall").model.upper().startswith("WT310E")
        assert len(run.source("wall")) >= 10


def unplug_once_streaming(ps3: PowerSensor3Emulator, done: threading.Event) -> threading.Thread:
    """Pull the cable once the recording streams from the meter (the emulator has sent it
    frames), not at a fixed time: under load the recording may not have opened the port
    1 s in, and a cable pulled before the open is a failed open, not a gap."""
    def wait_then_unplug() -> None:
        while ps3.frames_sent == 0:
            if done.wait(0.01):
                return
        ps3.disconnect()

    thread = threading.Thread(target=wait_then_unplug, daemon=True)
    thread.start()
    return thread


@pytest.mark.system
def test_meter_unplugged_mid_run_leaves_a_gap_and_the_rest_records(tmp_path, capsys):
    out = tmp_path / "unplugged.h5"
    done = threading.Event()
    with running(PowerSensor3Emulator(lambda t: 200.0)) as ps3:
        unplug = unplug_once_streaming(ps3, done)
        try:
            code = main(["record", "--simulate", "--duration", "2.5", "-o", str(out),
                         "--meter", f"ps3:{ps3.path}"])
        finally:
            done.set()
            unplug.join()
    assert ps3.frames_sent > 0, "the recording never streamed from the meter"
    assert code == 1
    assert ps3.path in capsys.readouterr().err
    with wattlab.open(str(out)) as run:
        failed = [g for g in run.gaps if g.source == "ps3" and g.reason.startswith("source failed")]
        assert failed, run.gaps
        samples = run.source("gpu0.samples")
        assert np.ptp(samples.time_ns) / 1e9 > 2.0, "NVML kept recording after the meter died"
        assert samples.time_ns.max() > failed[0].time_first_ns, "NVML recorded after the fault"


@pytest.fixture
def no_nvidia_driver(monkeypatch):
    """A machine without the NVIDIA driver: this one where that is so, else pynvml made to
    fail as it fails there (the driver cannot be uninstalled for a test)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return
    pynvml.nvmlShutdown()

    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)


@pytest.mark.system
@pytest.mark.parametrize("mode", [[], ["--source-processes"]])
def test_meters_record_without_a_gpu_driver_by_default(tmp_path, capsys, no_nvidia_driver,
                                                       mode):
    out = tmp_path / "meters.h5"
    with running(PowerSensor3Emulator(lambda t: 120.0)) as ps3:
        code = main(["record", *mode, "--meter", f"ps3:{ps3.path}", "--duration", "1",
                     "--no-live", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    said = [line for line in err.splitlines() if "no GPU found" in line]
    assert len(said) == 1 and "NVIDIA driver" in said[0], err
    with wattlab.open(str(out)) as run:
        assert list(run.sources) == ["ps3"]
        assert abs(np.mean(run.source("ps3").channel("power_total_w")) - 120.0) < 5.0


@pytest.mark.fast
def test_gpus_named_or_nothing_else_still_need_the_driver(tmp_path, capsys, no_nvidia_driver):
    with running(PowerSensor3Emulator(lambda t: 120.0)) as ps3:
        assert main(["record", "--nvml", "0", "--meter", f"ps3:{ps3.path}", "--duration", "1",
                     "--no-live", "-o", str(tmp_path / "a.h5")]) == 2
    assert "NVML library not found" in capsys.readouterr().err
    assert main(["record", "--duration", "1", "--no-live", "-o", str(tmp_path / "b.h5")]) == 2
    assert "NVML library not found" in capsys.readouterr().err
    assert not (tmp_path / "a.h5").exists() and not (tmp_path / "b.h5").exists()


@pytest.mark.system
def test_wrong_port_is_a_clear_error_naming_it(tmp_path, capsys):
    code = main(["record", "--simulate", "--duration", "1", "-o", str(tmp_path / "x.h5"),
                 "--meter", "ps3:/dev/no-such-port"])
    assert code == 1
    assert "/dev/no-such-port" in capsys.readouterr().err


@pytest.mark.system
def test_emulate_prints_a_port_that_a_driver_can_open_and_stops_on_ctrl_c():
    from wattlab.drivers.powersensor3 import PowerSensor3
    from wattlab.drivers.transport import SerialTransport

    with emulator_cli([sys.executable, "-m", "wattlab.cli", "emulate", "powersensor3"]) as (
            proc, line):
        path = line.strip()
        assert path.startswith("/dev/pts/")
        transport = SerialTransport(path, timeout_s=2.0)
        try:
            assert PowerSensor3(transport).read_version().startswith("F411")
        finally:
            transport.close()
        assert ctrl_c(proc, 20) == 130  # docs/cli.md: 130 after Ctrl-C


@pytest.mark.fast
def test_emulate_unknown_instrument_is_a_usage_error(capsys):
    assert main(["emulate", "tricorder"]) == 2
    assert "tricorder" in capsys.readouterr().err


@pytest.mark.system
def test_emulated_analyser_serves_visa(tmp_path):
    from wattlab.drivers.scpi import ScpiTransport

    with emulator_cli([sys.executable, "-m", "wattlab.cli", "emulate", "wt310e"]) as (
            proc, line):
        resource = line.split()[-1]
        assert resource.startswith("TCPIP::127.0.0.1::")
        transport = ScpiTransport(resource)
        try:
            assert "WT310E" in transport.query("*IDN?")
        finally:
            transport.close()
        assert ctrl_c(proc, 20) == 130  # docs/cli.md: 130 after Ctrl-C


@pytest.mark.system
def test_a_source_process_that_cannot_open_names_its_source_once(tmp_path, capsys,
                                                                  no_nvidia_driver):
    out = tmp_path / "none.h5"
    code = main(["record", "--source-processes", "--meter", f"ps3:{tmp_path / 'nosuch'}",
                 "--duration", "1", "--no-live", "-o", str(out)])
    err = capsys.readouterr().err
    assert code != 0, err
    assert "source ps3:" in err and "source ps3: source ps3:" not in err, err
    assert not out.exists()
