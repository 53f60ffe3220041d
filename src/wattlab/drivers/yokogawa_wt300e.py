"""Yokogawa WT300E power analysers (WT310E/WT310EH/WT332E/WT333E) over SCPI.

Facts from PROTOCOLS.md §4 (yoko-tool and the WT manuals). Models are a table (elements,
update rates, command dialect) and settings are declared as data, so WT500/WT1800 become
new table rows plus whatever commands differ. Tolerant where the sources disagree:
``:RATE`` is sent (yoko-tool's ``:SAMP:RATE`` is the **[unverified]** alternative), the
integration state is matched by prefix (verbose or short replies), and the error queue
is read with or without message text.

Fresh updates: ``:STAT:FILT1 FALL`` makes bit 0 of the extended event register latch at
the end of every data update; ``:COMM:WAIT 1`` blocks until that bit is set and
``:STAT:EESR?`` reads-and-clears it. Waiting first and clearing second means an update
that happened while we were away is still latched, so none is lost, and each latch is
consumed once, so none is read twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.drivers.scpi import (
    Identity,
    ScpiInstrument,
    Setting,
    TextTransport,
    parse_idn,
    parse_number_list,
)
from wattlab.errors import MeterError, MeterProtocolError, UsageError
from wattlab.samples import Channel


@dataclass(frozen=True)
class YokogawaModel:
    """One analyser model: what it measures and which command dialect it speaks."""

    name: str
    elements: tuple[int, ...]
    rates_s: tuple[float, ...]
    dialect: str
    max_items: int
    has_sigma: bool


WT300E_RATES_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
MODELS: dict[str, YokogawaModel] = {
    m.name: m
    for m in (
        YokogawaModel("WT310E", (1,), WT300E_RATES_S, "WT300", 10, False),
        YokogawaModel("WT310EH", (1,), WT300E_RATES_S, "WT300", 10, False),
        YokogawaModel("WT332E", (1, 2), WT300E_RATES_S, "WT300", 10, True),
        YokogawaModel("WT333E", (1, 2, 3), WT300E_RATES_S, "WT300", 10, True),
    )
}


@dataclass(frozen=True)
class NumericFunction:
    """A measurement function: its short SCPI name, SI channel, scale to SI, meaning."""

    code: str
    channel: str
    unit: str
    scale: float
    meaning: str


FUNCTIONS: dict[str, NumericFunction] = {
    f.code: f
    for f in (
        NumericFunction("U", "voltage_v", "V", 1.0, "RMS voltage"),
        NumericFunction("I", "current_a", "A", 1.0, "RMS current"),
        NumericFunction("P", "power_w", "W", 1.0, "active power"),
        NumericFunction("S", "apparent_power_va", "VA", 1.0, "apparent power"),
        NumericFunction("Q", "reactive_power_var", "var", 1.0, "reactive power"),
        NumericFunction("LAMB", "power_factor", "1", 1.0, "power factor"),
        NumericFunction("PHI", "phase_rad", "rad", math.pi / 180.0, "phase angle"),
        NumericFunction("FU", "voltage_frequency_hz", "Hz", 1.0, "voltage frequency"),
        NumericFunction("FI", "current_frequency_hz", "Hz", 1.0, "current frequency"),
        NumericFunction("UPP", "voltage_peak_pos_v", "V", 1.0, "voltage positive peak"),
        NumericFunction("UMP", "voltage_peak_neg_v", "V", 1.0, "voltage negative peak"),
        NumericFunction("IPP", "current_peak_pos_a", "A", 1.0, "current positive peak"),
        NumericFunction("IMP", "current_peak_neg_a", "A", 1.0, "current negative peak"),
        NumericFunction("PPP", "power_peak_pos_w", "W", 1.0, "power positive peak"),
        NumericFunction("PMP", "power_peak_neg_w", "W", 1.0, "power negative peak"),
        NumericFunction("WH", "energy_j", "J", 3600.0, "integrated energy (Wh x 3600)"),
        NumericFunction("WHP", "energy_pos_j", "J", 3600.0, "positive energy (Wh x 3600)"),
        NumericFunction("WHM", "energy_neg_j", "J", 3600.0, "negative energy (Wh x 3600)"),
        NumericFunction("AH", "charge_c", "C", 3600.0, "integrated charge (Ah x 3600)"),
        NumericFunction("AHP", "charge_pos_c", "C", 3600.0, "positive charge (Ah x 3600)"),
        NumericFunction("AHM", "charge_neg_c", "C", 3600.0, "negative charge (Ah x 3600)"),
        NumericFunction("TIME", "integration_time_s", "s", 1.0, "integration time"),
        NumericFunction("MATH", "math", "1", 1.0, "MATH result"),
    )
}
# Long spellings users may type; the short form is what goes on the wire.
FUNCTION_ALIASES = {
    "LAMBDA": "LAMB", "UPPEAK": "UPP", "UMPEAK": "UMP", "IPPEAK": "IPP",
    "IMPEAK": "IMP", "PPPEAK": "PPP", "PMPEAK": "PMP",
}
INTEGRATION_STATES = ("RES", "STAR", "STOP", "TIM", "ERR")
INTEGRATION_STATE_NAMES = {
    "RES": "reset", "STAR": "start", "STOP": "stop", "TIM": "timeup", "ERR": "error",
}
UPDATE_BIT = 0x01
COMMANDS = {
    "item_count": ":NUM:NORM:NUM",
    "item": ":NUM:NORM:ITEM{index}",
    "values": ":NUM:NORM:VAL?",
    "event_clear": ":STAT:EESR?",
    "event_wait": ":COMM:WAIT 1",
    "update_filter": ":STAT:FILT1 FALL",
    "integ_start": ":INTEG:STAR",
    "integ_stop": ":INTEG:STOP",
    "integ_reset": ":INTEG:RES",
    "integ_state": ":INTEG:STAT?",
}


def normalise_function(name: str) -> str:
    """Short wire name of a function (``lambda`` → ``LAMB``); UsageError if unknown."""
    code = FUNCTION_ALIASES.get(name.upper(), name.upper())
    if code not in FUNCTIONS:
        raise UsageError(f"unknown WT300E function {name!r}; known: {', '.join(FUNCTIONS)}")
    return code


def _encode_rate(driver: Wt300e, rate_s: float) -> str:
    if not any(abs(rate_s - r) < 1e-9 for r in driver.model.rates_s):
        raise UsageError(
            f"{driver.resource}: update rate {rate_s} s not offered by {driver.model.name}; "
            f"choose one of {driver.model.rates_s}"
        )
    return f"{rate_s:g}"


def _encode_integration_mode(driver: Wt300e, mode: str) -> str:
    code = mode.upper()[:4]
    if code not in ("NORM", "CONT"):
        raise UsageError(f"{driver.resource}: integration mode {mode!r} is not NORMal/CONTinuous")
    return code


def _encode_timer(driver: Wt300e, seconds: int) -> str:
    if not 0 <= seconds <= 10000 * 3600:
        raise UsageError(f"{driver.resource}: integration timer {seconds} s is out of range")
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours},{minutes},{secs}"


def _decode_timer(reply: str) -> int:
    """``H,M,S`` as whole seconds; INF or NAN (a faulty answer) is a ValueError, named."""
    parts = [float(x) for x in reply.split(",")]
    if len(parts) != 3 or not all(math.isfinite(p) and p >= 0 for p in parts):
        raise ValueError("expected hours,minutes,seconds as three finite counts >= 0")
    hours, minutes, secs = (int(p) for p in parts)
    return hours * 3600 + minutes * 60 + secs


class Wt300e(ScpiInstrument):
    """A WT300E on a ``TextTransport``; ``connect()`` talks to it, ``__init__`` never does."""

    ERROR_QUERY = ":STAT:ERR?"

    update_rate_s = Setting(":RATE", _encode_rate, float, "data update interval, seconds")
    integration_mode = Setting(
        ":INTEG:MODE", _encode_integration_mode, str, "NORMal (timer) or CONTinuous"
    )
    integration_timer_s = Setting(
        ":INTEG:TIM", _encode_timer, _decode_timer, "integration timer, whole seconds"
    )

    def __init__(self, transport: TextTransport, model: str | None = None) -> None:
        super().__init__(transport)
        self.expected_model = model.upper() if model else None
        if self.expected_model is not None and self.expected_model not in MODELS:
            raise UsageError(f"unknown Yokogawa model {model!r}; known: {', '.join(MODELS)}")
        self.model = MODELS[self.expected_model or "WT310E"]
        self.identity: Identity | None = None
        self.items: list[tuple[str, int | str]] = []

    def connect(self) -> Identity:
        """Identify, check the model, and put the analyser in the state this driver expects."""
        identity = parse_idn(self.transport.query("*IDN?"), self.resource)
        got = identity.model.upper()
        if self.expected_model is not None and got != self.expected_model:
            raise MeterError(
                f"{self.resource}: expected a {self.expected_model}, got {identity.model!r} "
                f"({identity.manufacturer})"
            )
        if got not in MODELS:
            raise MeterError(
                f"{self.resource}: expected one of {', '.join(MODELS)}, got {identity.model!r}"
            )
        self.model = MODELS[got]
        self.transport.write(":STAT:QMES ON")
        self.drain_errors()  # left by an earlier session; not ours to report
        for cmd in (
            ":COMM:HEAD OFF",
            ":NUM:FORM ASCII",
            f":SYST:COMM:COMM {self.model.dialect}",
            ":COMM:VERB ON",
            COMMANDS["update_filter"],
        ):
            self.apply(cmd)
        self.identity = identity
        return identity

    def select_items(self, items: Sequence[tuple[str, int | str]]) -> list[Channel]:
        """Choose what ``read_values`` returns: (function, element) pairs, in order."""
        if not 1 <= len(items) <= self.model.max_items:
            raise UsageError(
                f"{self.resource}: {len(items)} items; {self.model.name} takes 1-"
                f"{self.model.max_items}"
            )
        chosen = [(normalise_function(fn), self._element(el)) for fn, el in items]
        self.apply(f"{COMMANDS['item_count']} {len(chosen)}")
        for index, (code, element) in enumerate(chosen, start=1):
            self.apply(f"{COMMANDS['item'].format(index=index)} {code},{element}")
        self.items = chosen
        return item_channels(chosen)

    def _element(self, element: int | str) -> int | str:
        if isinstance(element, str) and element.upper() == "SIGMA":
            if not self.model.has_sigma:
                raise UsageError(f"{self.resource}: {self.model.name} has no SIGMA element")
            return "SIGMA"
        if element not in self.model.elements:
            raise UsageError(
                f"{self.resource}: element {element!r} not on {self.model.name} "
                f"(elements {self.model.elements})"
            )
        return int(element)

    def clear_update_event(self) -> None:
        """Forget updates so far, so the next ``wait_update`` waits for a new one."""
        self.transport.query(COMMANDS["event_clear"])

    def wait_update(self) -> bool:
        """Block until an update has happened since the last call, then consume it.

        Returns False if the wait ended for another event (no update to read).
        """
        self.transport.write(COMMANDS["event_wait"])
        return self.take_update_event()

    def take_update_event(self) -> bool:
        """Read and clear the event register: True if the data updated since its last read.

        Asked right after ``read_values`` it says whether an update landed during the read,
        when the values may already be the newer update's.
        """
        reply = self.transport.query(COMMANDS["event_clear"])
        # the extended event register is a 16-bit integer: anything else is a protocol error
        text = reply.strip()
        if not (text.isascii() and text.isdigit()) or int(text) > 0xFFFF:
            raise MeterProtocolError(f"{self.resource}: :STAT:EESR? answered {reply!r}, "
                                     "not a register value 0..65535")
        return bool(int(text) & UPDATE_BIT)

    def read_values(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.uint8]]:
        """The selected items of the latest update in SI units, with bad-value flags."""
        if not self.items:
            raise UsageError(f"{self.resource}: select_items() before read_values()")
        reply = self.transport.query(COMMANDS["values"])
        values, flags = parse_number_list(reply, self.resource, expected=len(self.items))
        scales = np.array([FUNCTIONS[code].scale for code, _ in self.items])
        return values * scales, flags

    def integration_start(self) -> None:
        """Start (or continue) integrating energy."""
        self.apply(COMMANDS["integ_start"])

    def integration_stop(self) -> None:
        """Hold the integrated values."""
        self.apply(COMMANDS["integ_stop"])

    def integration_reset(self) -> None:
        """Zero the integrated values (only when stopped)."""
        self.apply(COMMANDS["integ_reset"])

    def integration_state(self) -> str:
        """One of reset, start, stop, timeup, error."""
        reply = self.transport.query(COMMANDS["integ_state"]).strip().upper()
        for prefix in INTEGRATION_STATES:
            if reply.startswith(prefix):
                return INTEGRATION_STATE_NAMES[prefix]
        raise MeterProtocolError(f"{self.resource}: :INTEG:STAT? answered {reply!r}")


def item_channels(items: Sequence[tuple[str, int | str]]) -> list[Channel]:
    """SI channels for (function, element) items; element suffix only when several."""
    elements = {el for _, el in items}
    channels = []
    for code, element in items:
        fn = FUNCTIONS[code]
        tag = f"e{str(element).lower()}"
        if len(elements) > 1 and fn.unit == "1":
            name = f"{fn.channel}_{tag}"
        elif len(elements) > 1:
            base, _, unit_suffix = fn.channel.rpartition("_")
            name = f"{base}_{tag}_{unit_suffix}"
        else:
            name = fn.channel
        channels.append(Channel(name, fn.unit, f"{fn.meaning}, function {code}, element {element}"))
    return channels
