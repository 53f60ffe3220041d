import math

import numpy as np
import pytest

from wattlab.acquisition.acquirers.acquirer import Chunk
from wattlab.acquisition.acquirers.scpi_acquirers import Wt300eAcquirer
from wattlab.drivers.scpi import ScpiError
from wattlab.drivers.yokogawa_wt300e import Wt300e
from wattlab.errors import MeterError, MeterProtocolError, MeterTimeoutError, UsageError
from wattlab.samples import Gap, SampleFlag
from wattlab.testing import Reply, ScriptedTextTransport, expected_scpi

pytestmark = pytest.mark.fast

IDN = "YOKOGAWA,WT310E,C2XA00001,F1.03"


def ok(cmd: str) -> list[tuple[str, Reply]]:
    return [(cmd, None), (":STAT:ERR?", '0,"No error"')]


INIT: list[tuple[str, Reply]] = [
    ("*IDN?", IDN),
    (":STAT:QMES ON", None),
    (":STAT:ERR?", '0,"No error"'),
    *ok(":COMM:HEAD OFF"),
    *ok(":NUM:FORM ASCII"),
    *ok(":SYST:COMM:COMM WT300"),
    *ok(":COMM:VERB ON"),
    *ok(":STAT:FILT1 FALL"),
]


def connected(extra: list[tuple[str, Reply]], model: str | None = "WT310E") -> tuple[
        Wt300e, ScriptedTextTransport]:
    t = ScriptedTextTransport(INIT + extra)
    meter = Wt300e(t, model)
    meter.connect()
    return meter, t


def test_init_sequence_exact() -> None:
    meter, t = connected([])
    assert meter.identity is not None and meter.identity.serial == "C2XA00001"
    t.assert_consumed()


def test_stale_errors_are_drained_at_init() -> None:
    script = list(INIT)
    script[2:3] = [(":STAT:ERR?", '113,"Undefined header"'), (":STAT:ERR?", "0")]
    t = ScriptedTextTransport(script)
    Wt300e(t).connect()
    t.assert_consumed()


def test_wrong_model_names_expected_and_got() -> None:
    t = ScriptedTextTransport([("*IDN?", "YOKOGAWA,WT333E,X,F1")], "USB0::X::INSTR")
    with (
        expected_scpi(Wt300e, t, "WT310E") as meter,
        pytest.raises(MeterError, match=r"USB0::X::INSTR: expected a WT310E, got 'WT333E'"),
    ):
        meter.connect()
    with (
        expected_scpi(Wt300e, [("*IDN?", "YOKOGAWA,WT1800E,X,F1")]) as meter,
        pytest.raises(MeterError, match=r"expected one of WT310E.*got 'WT1800E'"),
    ):
        meter.connect()


def test_item_selection_and_reading_in_si() -> None:
    meter, t = connected([
        *ok(":NUM:NORM:NUM 4"),
        *ok(":NUM:NORM:ITEM1 U,1"),
        *ok(":NUM:NORM:ITEM2 P,1"),
        *ok(":NUM:NORM:ITEM3 WH,1"),
        *ok(":NUM:NORM:ITEM4 LAMB,1"),
        (":NUM:NORM:VAL?", "230.12E+00,441.50E+00,0.5000E+00,9.9E+37"),
    ])
    channels = meter.select_items([("U", 1), ("P", 1), ("WH", 1), ("lambda", 1)])
    assert [c.name for c in channels] == ["voltage_v", "power_w", "energy_j", "power_factor"]
    assert "element 1" in channels[0].meaning and "function U" in channels[0].meaning
    values, flags = meter.read_values()
    assert values[:3].tolist() == pytest.approx([230.12, 441.5, 1800.0])
    assert math.isnan(values[3]) and flags[3] == SampleFlag.OVERRANGE
    t.assert_consumed()


def test_multi_element_channel_names() -> None:
    t = ScriptedTextTransport([
        ("*IDN?", "YOKOGAWA,WT333E,X,F1"), (":STAT:QMES ON", None), (":STAT:ERR?", "0"),
        *[e for cmd in (":COMM:HEAD OFF", ":NUM:FORM ASCII", ":SYST:COMM:COMM WT300",
                        ":COMM:VERB ON", ":STAT:FILT1 FALL") for e in ok(cmd)],
        *ok(":NUM:NORM:NUM 3"), *ok(":NUM:NORM:ITEM1 P,1"), *ok(":NUM:NORM:ITEM2 P,3"),
        *ok(":NUM:NORM:ITEM3 LAMB,SIGMA"),
    ])
    meter = Wt300e(t)
    meter.connect()
    names = [c.name for c in meter.select_items([("P", 1), ("P", 3), ("LAMB", "sigma")])]
    assert names == ["power_e1_w", "power_e3_w", "power_factor_esigma"]
    with pytest.raises(UsageError, match="element 4"):
        meter.select_items([("P", 4)])
    t.assert_consumed()


def test_rate_setting_and_query() -> None:
    meter, t = connected([*ok(":RATE 0.1"), *ok(":RATE 5"), (":RATE?", "100.0E-03")])
    meter.update_rate_s = 0.1
    meter.update_rate_s = 5
    assert meter.update_rate_s == pytest.approx(0.1)
    with pytest.raises(UsageError, match=r"0\.3 s not offered by WT310E"):
        meter.update_rate_s = 0.3
    t.assert_consumed()


def test_error_queue_becomes_meter_error_with_code() -> None:
    meter, t = connected([
        (":RATE 0.5", None),
        (":STAT:ERR?", '813,"Not allowed during integration"'),
        (":STAT:ERR?", '222,"Data out of range"'),
        (":STAT:ERR?", '0,"No error"'),
    ])
    with pytest.raises(ScpiError) as info:
        meter.update_rate_s = 0.5
    assert info.value.code == 813 and info.value.message == "Not allowed during integration"
    assert "SCRIPTED" in str(info.value) and "222" in str(info.value)
    assert isinstance(info.value, MeterError)
    t.assert_consumed()


def test_integration_commands() -> None:
    meter, t = connected([
        *ok(":INTEG:MODE NORM"),
        *ok(":INTEG:TIM 1,2,3"),
        *ok(":INTEG:RES"),
        *ok(":INTEG:STAR"),
        (":INTEG:STAT?", "START"),
        *ok(":INTEG:STOP"),
        (":INTEG:STAT?", "STOP"),
        (":INTEG:STAT?", "TIM"),
        (":INTEG:TIM?", "1,2,3"),
        (":INTEG:STAT?", "BOGUS"),
    ])
    meter.integration_mode = "normal"
    meter.integration_timer_s = 3723
    meter.integration_reset()
    meter.integration_start()
    assert meter.integration_state() == "start"
    meter.integration_stop()
    assert meter.integration_state() == "stop"
    assert meter.integration_state() == "timeup"
    assert meter.integration_timer_s == 3723
    with pytest.raises(MeterProtocolError, match="BOGUS"):
        meter.integration_state()
    t.assert_consumed()


def test_update_wait_sequence() -> None:
    meter, t = connected([
        (":STAT:EESR?", "1"),
        (":COMM:WAIT 1", None),
        (":STAT:EESR?", "1"),
        (":COMM:WAIT 1", None),
        (":STAT:EESR?", "0"),
        (":COMM:WAIT 1", None),
        (":STAT:EESR?", "junk"),
    ])
    meter.clear_update_event()
    assert meter.wait_update() is True
    assert meter.wait_update() is False
    with pytest.raises(MeterProtocolError):
        meter.wait_update()
    t.assert_consumed()


OPEN_ACQUIRER: list[tuple[str, Reply]] = [
    *INIT,
    *ok(":RATE 0.1"),
    *ok(":NUM:NORM:NUM 3"),
    *ok(":NUM:NORM:ITEM1 U,1"), *ok(":NUM:NORM:ITEM2 I,1"), *ok(":NUM:NORM:ITEM3 P,1"),
    (":STAT:EESR?", "0"),
]


def test_acquirer_over_script_captures_one_update_per_wait() -> None:
    t = ScriptedTextTransport([
        *OPEN_ACQUIRER,
        (":COMM:WAIT 1", None), (":STAT:EESR?", "1"),
        (":NUM:NORM:VAL?", "230.0E+00,2.0E+00,NAN"),
        (":STAT:EESR?", "0"),  # no update landed during the read
    ])
    acq = Wt300eAcquirer("SCRIPTED", model="WT310E", transport=t)
    (desc,) = acq.open()
    assert desc.model == "WT310E" and desc.serial == "C2XA00001" and desc.firmware == "F1.03"
    assert desc.config["rate_s"] == 0.1 and desc.config["items"] == ["U,1", "I,1", "P,1"]
    (chunk,) = acq.poll()
    assert isinstance(chunk, Chunk) and chunk.flags is not None
    assert chunk.values[0, :2].tolist() == [230.0, 2.0] and np.isnan(chunk.values[0, 2])
    assert chunk.flags.tolist() == [SampleFlag.NO_DATA]
    acq.close()
    assert t.closed
    t.assert_consumed()


def _poll_with_an_update_during_the_read(second_read: str) -> list[object]:
    t = ScriptedTextTransport([
        *OPEN_ACQUIRER,
        (":COMM:WAIT 1", None), (":STAT:EESR?", "1"),
        (":NUM:NORM:VAL?", "230.0E+00,2.0E+00,460.0E+00"),
        (":STAT:EESR?", "1"),  # the next update landed while the values were read
        (":NUM:NORM:VAL?", second_read),
    ])
    acq = Wt300eAcquirer("SCRIPTED", model="WT310E", transport=t)
    acq.open()
    out = acq.poll()
    t.assert_consumed()
    return out


def test_an_update_after_the_values_were_read_is_read_too() -> None:
    out = _poll_with_an_update_during_the_read("230.1E+00,2.1E+00,483.0E+00")
    assert [type(r) for r in out] == [Chunk, Chunk]
    assert [r.values[0, 2] for r in out if isinstance(r, Chunk)] == [460.0, 483.0]


def test_values_already_replaced_are_kept_once_and_the_unread_update_is_a_gap() -> None:
    out = _poll_with_an_update_during_the_read("230.0E+00,2.0E+00,460.0E+00")
    gap, chunk = out
    assert isinstance(gap, Gap) and gap.samples_lost == 1
    assert isinstance(chunk, Chunk) and chunk.values[0, 2] == 460.0
    assert gap.t_first_ns is not None and gap.t_first_ns < chunk.t_host_ns[0]


def test_timeout_propagates() -> None:
    with (
        expected_scpi(Wt300e, [("*IDN?", MeterTimeoutError("X: no reply"))]) as meter,
        pytest.raises(MeterTimeoutError, match="X: no reply"),
    ):
        meter.connect()


def test_read_before_select_is_usage_error() -> None:
    meter, _ = connected([])
    with pytest.raises(UsageError):
        meter.read_values()
    with pytest.raises(UsageError):
        Wt300e(ScriptedTextTransport([]), "WT9999")
