"""Emulated Yokogawa WT300E (WT310E by default) on a TCP port, from PROTOCOLS.md §4.

Data updates happen at the update rate on the host's monotonic clock (computed lazily
when a command arrives, so no timer thread); each update latches bit 0 of the extended
event register when ``:STAT:FILT1`` is RISE/FALL/BOTH, and ``:COMM:WAIT`` holds the
connection until a latched bit matches. Integration runs reset → start → stop (or
timeup), adding each update's power × interval; changing settings while integrating
queues error 813. Readings come from ``WallLoad`` (node DC power → AC at the wall).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable

from wattlab.hardware.emulators.scpi_server import (
    Reply,
    ScpiCommand,
    ScpiDevice,
    WallLoad,
    demo_node_power_w,
    format_nr3,
    monotonic_ns,
)

MODEL_ELEMENTS = {"WT310E": 1, "WT310EH": 1, "WT332E": 2, "WT333E": 3}
RATES_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
NO_DATA = "9.91E+37"
ERR_NOT_DURING_INTEGRATION = (813, "Not allowed during integration")
ERR_PARAMETER = (222, "Data out of range")
ERR_SYNTAX = (102, "Syntax error")
MAX_WAIT_S = 30.0
MAX_CATCH_UP = 100_000
_RATE = re.compile(r"^([0-9.]+(?:[Ee][+-]?\d+)?)\s*(MS|S)?$")
FUNCTION_NAMES = {
    "U": "U", "I": "I", "P": "P", "S": "S", "Q": "Q", "LAMB": "LAMB", "LAMBDA": "LAMB",
    "PHI": "PHI", "FU": "FU", "FI": "FI", "UPP": "UPP", "UPPEAK": "UPP", "UMP": "UMP",
    "UMPEAK": "UMP", "IPP": "IPP", "IPPEAK": "IPP", "IMP": "IMP", "IMPEAK": "IMP",
    "PPP": "PPP", "PPPEAK": "PPP", "PMP": "PMP", "PMPEAK": "PMP", "WH": "WH", "WHP": "WHP",
    "WHM": "WHM", "AH": "AH", "AHP": "AHP", "AHM": "AHM", "TIME": "TIME", "MATH": "MATH",
}
STATE_TEXT = {
    "reset": ("RESET", "RES"), "start": ("START", "STAR"), "stop": ("STOP", "STOP"),
    "timeup": ("TIMEUP", "TIM"),
}


def parse_rate_s(text: str) -> float | None:
    """``0.1``, ``100MS``, ``1S`` → seconds; None if not a rate."""
    m = _RATE.match(text.strip().upper())
    if m is None:
        return None
    try:
        value = float(m.group(1))
    except ValueError:
        return None
    return value / 1000.0 if m.group(2) == "MS" else value


class Wt300eEmulator(ScpiDevice):
    """A WT300E-series analyser measuring ``WallLoad(node_power_w)``."""

    COMMAND_PATTERNS = (
        ("*RST", "_rst"),
        ("*CLS", "_cls"),
        (":STATus:QMESsage", "_set_qmes"),
        (":STATus:ERRor?", "_error_query"),
        (":STATus:FILTer#", "_set_filter"),
        (":STATus:EESR?", "_eesr_query"),
        (":COMMunicate:HEADer", "_set_header"),
        (":COMMunicate:VERBose", "_set_verbose"),
        (":COMMunicate:WAIT", "_wait"),
        (":NUMeric:FORMat", "_set_format"),
        (":SYSTem:COMMunicate:COMMand", "_set_dialect"),
        (":SYSTem:COMMunicate:COMMand?", "_dialect_query"),
        (":NUMeric:NORMal:NUMber", "_set_item_count"),
        (":NUMeric:NORMal:NUMber?", "_item_count_query"),
        (":NUMeric:NORMal:ITEM#", "_set_item"),
        (":NUMeric:NORMal:VALue?", "_values_query"),
        (":RATE", "_set_rate"),
        (":SAMPle:RATE", "_set_rate"),
        (":RATE?", "_rate_query"),
        (":SAMPle:RATE?", "_rate_query"),
        (":INTEGrate:MODE", "_set_integ_mode"),
        (":INTEGrate:MODE?", "_integ_mode_query"),
        (":INTEGrate:TIMer", "_set_integ_timer"),
        (":INTEGrate:TIMer?", "_integ_timer_query"),
        (":INTEGrate:STARt", "_integ_start"),
        (":INTEGrate:STOP", "_integ_stop"),
        (":INTEGrate:RESet", "_integ_reset"),
        (":INTEGrate:STATe?", "_integ_state_query"),
    )
    UNDEFINED_HEADER = (113, "Undefined header")

    def __init__(
        self,
        model: str = "WT310E",
        node_power_w: Callable[[int], float] | None = None,
        serial: str = "C3EMU0001",
        firmware: str = "F1.04",
        load: WallLoad | None = None,
    ) -> None:
        model = model.upper()
        super().__init__(f"YOKOGAWA,{model},{serial},{firmware}")
        self.n_elements = MODEL_ELEMENTS.get(model, 1)
        self.load = load or WallLoad(node_power_w or demo_node_power_w)
        self.update_condition = threading.Condition(self.lock)
        self._rst()

    def close(self) -> None:
        """Stop serving; a connection held in ``:COMM:WAIT`` is released at once."""
        self.stopping.set()
        with self.lock:
            self.update_condition.notify_all()
        super().close()

    # -- state ---------------------------------------------------------------------------
    def _rst(self, cmd: ScpiCommand | None = None, sfx: tuple[int, ...] = ()) -> Reply:
        self.qmes = False
        self.verbose = False
        self.header = True
        self.filter1 = "NEV"
        self.eesr = 0
        self.rate_s = 0.25
        self.items: list[tuple[str, str]] = [("U", "1"), ("I", "1"), ("P", "1")]
        self.integ_mode = "NORM"
        self.integ_timer_s = 0
        self.integ_state = "reset"
        self.integ_wh = 0.0
        self.integ_ah = 0.0
        self.integ_time_s = 0.0
        self.updates = 0
        self._restart_clock()
        return None

    def _restart_clock(self) -> None:
        self._t0_ns = monotonic_ns()
        self._last_k = 0
        self.latest = self._reading(self._t0_ns, self._t0_ns)

    def _rate_ns(self) -> int:
        return round(self.rate_s * 1e9)

    def next_update_ns(self) -> int:
        """Host time of the next data update."""
        return self._t0_ns + (self._last_k + 1) * self._rate_ns()

    def advance(self, now_ns: int | None = None) -> None:
        """Run every update due by now: new reading, event bit, integration."""
        with self.lock:
            self._advance(monotonic_ns() if now_ns is None else now_ns)

    def _advance(self, now_ns: int) -> None:
        rate_ns = self._rate_ns()
        k_now = (now_ns - self._t0_ns) // rate_ns
        if k_now <= self._last_k:
            return
        first = max(self._last_k + 1, k_now - MAX_CATCH_UP)
        for k in range(first, k_now + 1):
            t1 = self._t0_ns + k * rate_ns
            self.latest = self._reading(t1 - rate_ns, t1)
            self.updates += 1
            if self.filter1 in ("RISE", "FALL", "BOTH"):
                self.eesr |= 0x01
            if self.integ_state == "start":
                self._integrate(self.latest["P"], self.latest["I"])
        self._last_k = k_now
        self.update_condition.notify_all()

    def _integrate(self, power_w: float, current_a: float) -> None:
        dt_s = self.rate_s
        if self.integ_mode == "NORM" and self.integ_timer_s > 0:
            dt_s = min(dt_s, self.integ_timer_s - self.integ_time_s)
        self.integ_wh += power_w * dt_s / 3600.0
        self.integ_ah += current_a * dt_s / 3600.0
        self.integ_time_s += dt_s
        if self.integ_mode == "NORM" and 0 < self.integ_timer_s <= self.integ_time_s + 1e-9:
            self.integ_state = "timeup"

    def _reading(self, t0_ns: int, t1_ns: int) -> dict[str, float]:
        p_w = self.load.mean_wall_power_w(t0_ns, t1_ns)
        u_v = self.load.voltage_at(t1_ns)
        pf = self.load.power_factor
        i_a = p_w / (u_v * pf)
        s_va = u_v * i_a
        return {
            "U": u_v, "I": i_a, "P": p_w, "S": s_va,
            "Q": math.sqrt(max(s_va * s_va - p_w * p_w, 0.0)),
            "LAMB": pf, "PHI": math.degrees(math.acos(pf)),
            "FU": self.load.frequency_hz, "FI": self.load.frequency_hz,
            "UPP": u_v * math.sqrt(2), "UMP": -u_v * math.sqrt(2),
            "IPP": i_a * 1.6, "IMP": -i_a * 1.6, "PPP": p_w * 2.1, "PMP": -p_w * 0.05,
        }

    def _value(self, fn: str, element: str) -> str:
        share = 1.0 if element == "SIGMA" else 1.0 / self.n_elements
        split = {"I", "P", "S", "Q", "IPP", "IMP", "PPP", "PMP"}
        integ = {
            "WH": self.integ_wh, "WHP": self.integ_wh, "WHM": 0.0, "AH": self.integ_ah,
            "AHP": self.integ_ah, "AHM": 0.0, "TIME": self.integ_time_s,
        }
        if fn in integ:
            return format_nr3(integ[fn] * (share if fn != "TIME" else 1.0))
        if fn in self.latest:
            return format_nr3(self.latest[fn] * (share if fn in split else 1.0))
        return NO_DATA

    def _integrating(self) -> bool:
        if self.integ_state == "start":
            self.push_error(*ERR_NOT_DURING_INTEGRATION)
            return True
        return False

    # -- commands ------------------------------------------------------------------------
    def _cls(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.errors.clear()
        self.eesr = 0
        return None

    def _on_off(self, cmd: ScpiCommand) -> bool | None:
        value = cmd.arg().upper()
        if value in ("ON", "1"):
            return True
        if value in ("OFF", "0"):
            return False
        self.push_error(*ERR_PARAMETER)
        return None

    def _set_qmes(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        value = self._on_off(cmd)
        if value is not None:
            self.qmes = value
        return None

    def _set_header(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        value = self._on_off(cmd)
        if value is not None:
            self.header = value
        return None

    def _set_verbose(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        value = self._on_off(cmd)
        if value is not None:
            self.verbose = value
        return None

    def _error_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        code, message = self.pop_error()
        return f'{code},"{message}"' if self.qmes else str(code)

    def _set_filter(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        value = cmd.arg().upper()[:4]
        if sfx[0] < 1 or sfx[0] > 16 or value not in ("RISE", "FALL", "BOTH", "NEV"):
            self.push_error(*ERR_PARAMETER)
        elif sfx[0] == 1:
            self.filter1 = value
        return None

    def _eesr_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.advance()
        value, self.eesr = self.eesr, 0
        return str(value)

    def _wait(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        try:
            mask = int(cmd.arg())
        except ValueError:
            self.push_error(*ERR_PARAMETER)
            return None
        deadline_ns = monotonic_ns() + int(MAX_WAIT_S * 1e9)
        while not self.stopping.is_set():
            now = monotonic_ns()
            self.advance(now)
            if self.eesr & mask or now >= deadline_ns:
                return None
            # Released by the next update, or early by close(); the lock is freed meanwhile.
            self.update_condition.wait(max((self.next_update_ns() - now) / 1e9, 0.0) + 1e-4)
        return None

    def _set_format(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        if not cmd.arg().upper().startswith("ASC"):
            self.push_error(*ERR_PARAMETER)  # only ASCII is emulated
        return None

    def _set_dialect(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        if cmd.arg().upper() not in ("WT300", "WT300E"):
            self.push_error(*ERR_PARAMETER)
        return None

    def _dialect_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return "WT300"

    def _set_item_count(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        try:
            n = int(cmd.arg())
        except ValueError:
            n = 0
        if not 1 <= n <= 10:
            self.push_error(*ERR_PARAMETER)
            return None
        while len(self.items) < n:
            self.items.append(("U", "1"))
        del self.items[n:]
        return None

    def _item_count_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return str(len(self.items))

    def _set_item(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        index = sfx[0]
        fn = FUNCTION_NAMES.get(cmd.arg(0).upper())
        element = (cmd.arg(1) or "1").upper()
        valid_element = element in {str(e) for e in range(1, self.n_elements + 1)} or (
            element == "SIGMA" and self.n_elements > 1
        )
        if fn is None or not valid_element or not 1 <= index <= 10:
            self.push_error(*ERR_PARAMETER)
            return None
        if index > len(self.items):
            self.push_error(*ERR_PARAMETER)  # :NUM:NORM:NUM first
            return None
        self.items[index - 1] = (fn, element)
        return None

    def _values_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.advance()
        bad = self.take_bad_value()
        if bad is not None:
            return ",".join([bad] * len(self.items))
        return ",".join(self._value(fn, el) for fn, el in self.items)

    def _set_rate(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        rate = parse_rate_s(cmd.arg())
        if rate is None or not any(abs(rate - r) < 1e-9 for r in RATES_S):
            self.push_error(*ERR_PARAMETER)
        elif not self._integrating():
            self.advance()
            self.rate_s = rate
            self._restart_clock()
        return None

    def _rate_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return format_nr3(self.rate_s)

    def _set_integ_mode(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        mode = cmd.arg().upper()[:4]
        if mode not in ("NORM", "CONT"):
            self.push_error(*ERR_PARAMETER)
        elif not self._integrating():
            self.integ_mode = mode
        return None

    def _integ_mode_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return {"NORM": "NORMAL", "CONT": "CONTINUOUS"}[self.integ_mode] if self.verbose else (
            self.integ_mode
        )

    def _set_integ_timer(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        try:
            parts = [int(a) for a in cmd.args]
        except ValueError:
            parts = []
        if len(parts) != 3 or not (0 <= parts[0] <= 10000 and 0 <= parts[1] < 60 and
                                   0 <= parts[2] < 60):
            self.push_error(*ERR_PARAMETER)
        elif not self._integrating():
            self.integ_timer_s = parts[0] * 3600 + parts[1] * 60 + parts[2]
        return None

    def _integ_timer_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        hours, rest = divmod(self.integ_timer_s, 3600)
        return f"{hours},{rest // 60},{rest % 60}"

    def _integ_start(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.advance()
        if self.integ_state in ("start", "timeup"):
            self.push_error(*ERR_NOT_DURING_INTEGRATION)
        else:
            self.integ_state = "start"
        return None

    def _integ_stop(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.advance()
        if self.integ_state == "start":
            self.integ_state = "stop"
        return None

    def _integ_reset(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.advance()
        if not self._integrating():
            self.integ_state = "reset"
            self.integ_wh = self.integ_ah = self.integ_time_s = 0.0
        return None

    def _integ_state_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.advance()
        long, short = STATE_TEXT[self.integ_state]
        return long if self.verbose else short

