import numpy as np
import pytest

from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.acquirers.scpi_acquirers import Hmc8015Acquirer
from wattlab.drivers.hmc8015 import Hmc8015
from wattlab.drivers.scpi import ScpiError, encode_definite_block
from wattlab.errors import MeterError, MeterProtocolError, UsageError
from wattlab.samples import SampleFlag
from wattlab.testing import Reply, ScriptedTextTransport, expected_scpi

pytestmark = pytest.mark.fast

IDN = "Rohde&Schwarz,HMC8015,021234567,01.400"
NO_ERROR = '0,"No error"'


def ok(cmd: str) -> list[tuple[str, Reply]]:
    return [(cmd, None), ("SYST:ERR?", NO_ERROR)]


INIT: list[tuple[str, Reply]] = [("*IDN?", IDN), ("SYST:ERR?", NO_ERROR)]


def connected(extra: list[tuple[str, Reply]]) -> tuple[Hmc8015, ScriptedTextTransport]:
    t = ScriptedTextTransport(INIT + extra)
    meter = Hmc8015(t)
    meter.connect()
    return meter, t


def test_connect_and_wrong_model() -> None:
    meter, t = connected([])
    assert meter.identity is not None and meter.identity.serial == "021234567"
    t.assert_consumed()
    t = ScriptedTextTransport([("*IDN?", "Rohde&Schwarz,HMC8012,1,1")], "USB0::0x0AAD::INSTR")
    with (
        expected_scpi(Hmc8015, t) as other,
        pytest.raises(MeterError, match=r"USB0::0x0AAD::INSTR: expected a HMC8015, got 'HMC8012'"),
    ):
        other.connect()


def test_functions_ranging_and_data() -> None:
    meter, t = connected([
        *ok("CHAN1:ACQ:VOLT:RANG:AUTO ON"),
        *ok("CHAN1:ACQ:CURR:RANG:AUTO ON"),
        *ok("CHAN1:MEAS:FUNC URMS,IRMS,P,WH,PHI"),
        ("CHAN1:MEAS:DATA?", "2.3010E+02,1.9600E+00,4.4150E+02,2.0000E+00,9.91E+37"),
    ])
    meter.auto_range()
    channels = meter.set_functions(["urms", "IRMS", "P", "WH", "PHI"])
    assert [c.name for c in channels] == [
        "voltage_v", "current_a", "power_w", "energy_j", "phase_rad"]
    values, flags = meter.read_values()
    assert values[:4].tolist() == pytest.approx([230.1, 1.96, 441.5, 7200.0])
    assert np.isnan(values[4]) and flags.tolist() == [0, 0, 0, 0, SampleFlag.NO_DATA]
    t.assert_consumed()
    with pytest.raises(UsageError, match="unknown HMC8015 function"):
        meter.set_functions(["XYZ"])


def test_integrator_commands() -> None:
    meter, t = connected([
        *ok("INT:MODE DUR"),
        *ok("INT:DUR 60"),
        *ok("INT:RES"),
        *ok("INT:STAR"),
        *ok("INT:STOP"),
        ("INT:MODE?", "DUR"),
    ])
    meter.integration_mode = "duration"
    meter.integration_duration_s = 60
    meter.integration_reset()
    meter.integration_start()
    meter.integration_stop()
    assert meter.integration_mode == "DUR"
    t.assert_consumed()


def test_settings_error_carries_code() -> None:
    meter, t = connected([
        ("INT:MODE MAN", None),
        ("SYST:ERR?", '-221,"Settings conflict"'),
        ("SYST:ERR?", NO_ERROR),
    ])
    with pytest.raises(ScpiError) as info:
        meter.integration_mode = "MAN"
    assert info.value.code == -221 and info.value.message == "Settings conflict"
    t.assert_consumed()


LOG_CSV = (
    b"#Device;HMC8015\r\n#Interval[s];0.5\r\nTime;URMS[V];IRMS[A];P[W]\r\n"
    b"12:00:00.500;2.3000E+02;2.0000E+00;4.5000E+02\r\n"
    b"12:00:01.000;2.3100E+02;9.9E+37;4.6000E+02\r\n"
)


def test_log_setup_list_and_download() -> None:
    meter, t = connected([
        *ok("LOG:MODE UNL"),
        *ok("LOG:INT 0.5"),
        *ok('LOG:FNAM "run1",INT'),
        *ok("LOG:STAT ON"),
        *ok("LOG:STAT OFF"),
        ("DATA:LIST? INT", '"RUN1.CSV","DATA/OTHER.CSV","NOTES.TXT"'),
        ("SYST:ERR?", NO_ERROR),
        ('DATA:DATA? "DATA/RUN1.CSV"', encode_definite_block(LOG_CSV) + b"\n"),
        ("SYST:ERR?", NO_ERROR),
    ])
    meter.log_mode = "unlimited"
    meter.log_interval_s = 0.5
    assert meter.log_file("run1") == "run1.CSV"
    meter.log_start()
    meter.log_stop()
    assert meter.list_logs() == ["RUN1.CSV", "OTHER.CSV"]
    log = meter.read_log("RUN1.CSV")
    assert log.functions == ["URMS", "IRMS", "P"]
    assert log.time_of_day_s.tolist() == [43200.5, 43201.0]
    assert log.values[0].tolist() == [230.0, 2.0, 450.0]
    assert np.isnan(log.values[1, 1]) and log.flags.tolist() == [0, SampleFlag.OVERRANGE]
    assert log.metadata["Interval[s]"] == "0.5"
    t.assert_consumed()
    with pytest.raises(UsageError):
        meter.log_file("bad name!")


def test_missing_log_file_raises_from_error_queue() -> None:
    meter, t = connected([
        ('DATA:DATA? "DATA/GONE.CSV"', b"#10\n"),
        ("SYST:ERR?", '-256,"File name not found"'),
        ("SYST:ERR?", NO_ERROR),
    ])
    with pytest.raises(ScpiError, match="-256"):
        meter.download_log("DATA/GONE.CSV")
    t.assert_consumed()


def test_acquirer_flags_a_repeated_reading() -> None:
    t = ScriptedTextTransport([
        *INIT,
        *ok("CHAN1:ACQ:VOLT:RANG:AUTO ON"),
        *ok("CHAN1:ACQ:CURR:RANG:AUTO ON"),
        *ok("CHAN1:MEAS:FUNC URMS,IRMS,P"),
        ("CHAN1:MEAS:DATA?", "2.3E+02,2.0E+00,4.5E+02"),
        ("CHAN1:MEAS:DATA?", "2.3E+02,2.0E+00,4.5E+02"),
        ("CHAN1:MEAS:DATA?", "2.3E+02,2.0E+00,x"),
    ])
    acq = Hmc8015Acquirer("SCRIPTED", rate_s=0.01, transport=t)
    (desc,) = acq.open()
    assert desc.model == "HMC8015" and desc.config["functions"] == ["URMS", "IRMS", "P"]
    chunks: list[Chunk] = []
    while len(chunks) < 2:
        chunks += [c for c in acq.poll() if isinstance(c, Chunk)]
    assert [int(c.flags[0]) for c in chunks if c.flags is not None] == [0, SampleFlag.REPEAT]
    with pytest.raises(MeterProtocolError, match="'x'"):
        while True:
            acq.poll()
    acq.close()
    t.assert_consumed()
