"""Emulated R&S HMC8015 on a TCP port, from PROTOCOLS.md §5.

Measurements update every 100 ms on the host's monotonic clock (lazily, when a command
arrives), each with a little deterministic noise so two updates never read the same.
The integrator runs MAN (until stopped) or DUR (for ``INT:DUR`` seconds); the on-device
log appends one row per ``LOG:INT`` while ``LOG:STAT ON`` — rows are produced from the
load model for the times they cover, so a log left unattended fills as a real one would
— and ``LOG:STAT OFF`` stores ``DATA/<name>.CSV`` for ``DATA:LIST?`` / ``DATA:DATA?``.
Only the UNL log mode is emulated (others are accepted and behave like it).
"""

from __future__ import annotations

import datetime as dt
import math
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

UPDATE_NS = 100_000_000
NO_DATA = "9.91E+37"
ERR_PARAMETER = (-224, "Illegal parameter value")
ERR_CONFLICT = (-221, "Settings conflict")
ERR_NO_FILE = (-256, "File name not found")
FUNCTIONS = (
    "P", "S", "Q", "LAMB", "PHI", "FU", "FI", "URMS", "UAVG", "IRMS", "IAVG", "UTHD",
    "ITHD", "FPLL", "TIME", "WH", "WHP", "WHM", "AH", "AHP", "AHM", "URAN", "IRAN", "EMPT",
)
UNITS = {
    "P": "W", "S": "VA", "Q": "var", "LAMB": "", "PHI": "deg", "FU": "Hz", "FI": "Hz",
    "URMS": "V", "UAVG": "V", "IRMS": "A", "IAVG": "A", "UTHD": "%", "ITHD": "%",
    "FPLL": "Hz", "TIME": "s", "WH": "Wh", "WHP": "Wh", "WHM": "Wh", "AH": "Ah",
    "AHP": "Ah", "AHM": "Ah", "URAN": "V", "IRAN": "A", "EMPT": "",
}
MAX_CATCH_UP = 100_000


def _noise(k: int) -> float:
    """Deterministic ±0.05 % jitter per update index."""
    return 1.0 + 5e-4 * math.sin(k * 12.9898)


class Hmc8015Emulator(ScpiDevice):
    """An HMC8015 measuring ``WallLoad(node_power_w)``."""

    COMMAND_PATTERNS = (
        ("*RST", "_rst"),
        ("*CLS", "_cls"),
        ("SYSTem:ERRor?", "_error_query"),
        ("SYSTem:ERRor:NEXT?", "_error_query"),
        ("CHANnel#:MEASurement:FUNCtions", "_set_functions"),
        ("CHANnel#:MEASurement:FUNCtions?", "_functions_query"),
        ("CHANnel#:MEASurement:DATA?", "_data_query"),
        ("CHANnel#:ACQuire:VOLTage:RANGe:AUTO", "_set_volt_auto"),
        ("CHANnel#:ACQuire:CURRent:RANGe:AUTO", "_set_curr_auto"),
        ("CHANnel#:VOLTage:RANGe:AUTO", "_set_volt_auto"),
        ("CHANnel#:CURRent:RANGe:AUTO", "_set_curr_auto"),
        ("INTegrator:MODE", "_set_integ_mode"),
        ("INTegrator:MODE?", "_integ_mode_query"),
        ("INTegrator:DURation", "_set_integ_duration"),
        ("INTegrator:DURation?", "_integ_duration_query"),
        ("INTegrator:STARt", "_integ_start"),
        ("INTegrator:STOP", "_integ_stop"),
        ("INTegrator:RESet", "_integ_reset"),
        ("INTegrator:STATe?", "_integ_state_query"),
        ("LOG:MODE", "_set_log_mode"),
        ("LOG:MODE?", "_log_mode_query"),
        ("LOG:INTerval", "_set_log_interval"),
        ("LOG:INTerval?", "_log_interval_query"),
        ("LOG:FNAMe", "_set_log_name"),
        ("LOG:STATe", "_set_log_state"),
        ("LOG:STATe?", "_log_state_query"),
        ("DATA:LIST?", "_data_list"),
        ("DATA:DATA?", "_data_data"),
        ("DATA:DELete", "_data_delete"),
    )

    def __init__(
        self,
        node_power_w: Callable[[int], float] | None = None,
        serial: str = "021EMU0001",
        firmware: str = "01.400",
        load: WallLoad | None = None,
    ) -> None:
        super().__init__(f"Rohde&Schwarz,HMC8015,{serial},{firmware}")
        self.load = load or WallLoad(node_power_w or demo_node_power_w)
        self.files: dict[str, bytes] = {}
        self._rst()

    # -- state ---------------------------------------------------------------------------
    def _rst(self, cmd: ScpiCommand | None = None, sfx: tuple[int, ...] = ()) -> Reply:
        self.functions = ["URMS", "IRMS", "P"]
        self.volt_auto = self.curr_auto = False
        self.integ_mode = "MAN"
        self.integ_duration_s = 3600.0
        self.integ_state = "reset"
        self.integ_wh = self.integ_ah = self.integ_time_s = 0.0
        self.log_mode = "UNL"
        self.log_interval_s = 0.5
        self.log_name = "LOG"
        self.log_on = False
        self._log_rows: list[str] = []
        self._log_t0_ns = 0
        self._log_wall0 = dt.datetime.now()
        self._log_functions: list[str] = []
        self._t0_ns = monotonic_ns()
        self._last_k = 0
        self.latest = self._reading(self._t0_ns - UPDATE_NS, self._t0_ns, 0)
        return None

    def _reading(self, t0_ns: int, t1_ns: int, k: int) -> dict[str, float]:
        p_w = self.load.mean_wall_power_w(t0_ns, t1_ns) * _noise(k)
        u_v = self.load.voltage_at(t1_ns)
        pf = self.load.power_factor
        i_a = p_w / (u_v * pf)
        s_va = u_v * i_a
        return {
            "P": p_w, "S": s_va, "Q": math.sqrt(max(s_va * s_va - p_w * p_w, 0.0)),
            "LAMB": pf, "PHI": math.degrees(math.acos(pf)), "FU": self.load.frequency_hz,
            "FI": self.load.frequency_hz, "FPLL": self.load.frequency_hz, "URMS": u_v,
            "UAVG": u_v * 0.9003, "IRMS": i_a, "IAVG": i_a * 0.9, "UTHD": 1.8, "ITHD": 9.5,
            "URAN": 300.0 if self.volt_auto else 600.0, "IRAN": 5.0 if self.curr_auto else 20.0,
        }

    def advance(self) -> None:
        """Run every 100 ms update and log row due by now."""
        now = monotonic_ns()
        k_now = (now - self._t0_ns) // UPDATE_NS
        first = max(self._last_k + 1, k_now - MAX_CATCH_UP)
        for k in range(first, k_now + 1):
            t1 = self._t0_ns + k * UPDATE_NS
            self.latest = self._reading(t1 - UPDATE_NS, t1, k)
            if self.integ_state == "start":
                dt_s = UPDATE_NS / 1e9
                if self.integ_mode == "DUR":
                    dt_s = min(dt_s, self.integ_duration_s - self.integ_time_s)
                self.integ_wh += self.latest["P"] * dt_s / 3600.0
                self.integ_ah += self.latest["IRMS"] * dt_s / 3600.0
                self.integ_time_s += dt_s
                if self.integ_mode == "DUR" and self.integ_time_s >= self.integ_duration_s - 1e-9:
                    self.integ_state = "stop"
        self._last_k = max(self._last_k, k_now)
        if self.log_on:
            self._log_rows_until(now)

    def _value(self, fn: str, reading: dict[str, float]) -> str:
        integ = {
            "WH": self.integ_wh, "WHP": self.integ_wh, "WHM": 0.0, "AH": self.integ_ah,
            "AHP": self.integ_ah, "AHM": 0.0, "TIME": self.integ_time_s,
        }
        if fn in integ:
            return format_nr3(integ[fn])
        return format_nr3(reading[fn]) if fn in reading else NO_DATA

    def _log_rows_until(self, now_ns: int) -> None:
        step_ns = int(self.log_interval_s * 1e9)
        while True:
            n = len(self._log_rows) + 1
            t1 = self._log_t0_ns + n * step_ns
            if t1 > now_ns:
                return
            reading = self._reading(t1 - step_ns, t1, n)
            wall = self._log_wall0 + dt.timedelta(seconds=n * self.log_interval_s)
            stamp = wall.strftime("%H:%M:%S.") + f"{wall.microsecond // 1000:03d}"
            cells = [self._value(fn, reading) for fn in self._log_functions]
            self._log_rows.append(";".join([stamp, *cells]))

    def _finish_log(self) -> None:
        header = ";".join(["Time"] + [f"{fn}[{UNITS[fn]}]" for fn in self._log_functions])
        lines = [
            "#Device;HMC8015",
            f"#Serial;{self.idn.split(',')[2] if self.idn.count(',') >= 2 else ''}",
            f"#Date;{self._log_wall0.strftime('%Y-%m-%d')}",
            f"#Start;{self._log_wall0.strftime('%H:%M:%S')}",
            f"#Interval[s];{self.log_interval_s:g}",
            header,
            *self._log_rows,
        ]
        self.files[f"{self.log_name}.CSV".upper()] = ("\r\n".join(lines) + "\r\n").encode()
        self.log_on = False

    def _integrating(self) -> bool:
        if self.integ_state == "start":
            self.push_error(*ERR_CONFLICT)
            return True
        return False

    # -- commands ------------------------------------------------------------------------
    def _cls(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.errors.clear()
        return None

    def _error_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        code, message = self.pop_error()
        return f'{code},"{message}"'

    def _set_functions(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        names = [a.strip().upper() for a in cmd.args]
        names = ["LAMB" if n == "LAMBDA" else n for n in names]
        if sfx[0] != 1 or not names or len(names) > 10 or any(n not in FUNCTIONS for n in names):
            self.push_error(*ERR_PARAMETER)
        else:
            self.functions = names
        return None

    def _functions_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return ",".join(self.functions)

    def _data_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.advance()
        bad = self.take_bad_value()
        if bad is not None:
            return ",".join([bad] * len(self.functions))
        return ",".join(self._value(fn, self.latest) for fn in self.functions)

    def _auto(self, cmd: ScpiCommand) -> bool | None:
        value = cmd.arg().upper()
        if value in ("ON", "1"):
            return True
        if value in ("OFF", "0"):
            return False
        self.push_error(*ERR_PARAMETER)
        return None

    def _set_volt_auto(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        value = self._auto(cmd)
        if value is not None and not self._integrating():
            self.volt_auto = value
        return None

    def _set_curr_auto(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        value = self._auto(cmd)
        if value is not None and not self._integrating():
            self.curr_auto = value
        return None

    def _set_integ_mode(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        mode = cmd.arg().upper()
        mode = {"MANUAL": "MAN", "DURATION": "DUR"}.get(mode, mode)
        if mode not in ("MAN", "DUR", "SPAN"):
            self.push_error(*ERR_PARAMETER)
        elif not self._integrating():
            self.integ_mode = mode
        return None

    def _integ_mode_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return self.integ_mode

    def _seconds(self, cmd: ScpiCommand) -> float | None:
        try:
            value = float(cmd.arg())
        except ValueError:
            value = -1.0
        if not (value > 0 and math.isfinite(value)):
            self.push_error(*ERR_PARAMETER)
            return None
        return value

    def _set_integ_duration(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        value = self._seconds(cmd)
        if value is not None and not self._integrating():
            self.integ_duration_s = value
        return None

    def _integ_duration_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return format_nr3(self.integ_duration_s)

    def _integ_start(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        self.advance()
        if not self._integrating():
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
        return self.integ_state.upper()

    def _set_log_mode(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        mode = cmd.arg().upper()
        if mode not in ("UNL", "COUN", "DUR", "SPAN"):
            self.push_error(*ERR_PARAMETER)
        else:
            self.log_mode = mode
        return None

    def _log_mode_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return self.log_mode

    def _set_log_interval(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        value = self._seconds(cmd)
        if value is not None:
            if self.log_on:
                self.push_error(*ERR_CONFLICT)
            else:
                self.log_interval_s = max(value, 0.1)
        return None

    def _log_interval_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return format_nr3(self.log_interval_s)

    def _set_log_name(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        name = cmd.arg(0)
        if not name or not name.replace("_", "").replace("-", "").isalnum() or (
            cmd.arg(1).upper() not in ("INT", "")
        ):
            self.push_error(*ERR_PARAMETER)
        else:
            self.log_name = name
        return None

    def _set_log_state(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        value = self._auto(cmd)
        if value is None:
            return None
        self.advance()
        if value and not self.log_on:
            self.log_on = True
            self._log_rows = []
            self._log_t0_ns = monotonic_ns()
            self._log_wall0 = dt.datetime.now()
            self._log_functions = list(self.functions)
        elif not value and self.log_on:
            self._finish_log()
        return None

    def _log_state_query(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        return "1" if self.log_on else "0"

    def _data_list(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        if cmd.arg().upper() not in ("INT", ""):
            self.push_error(*ERR_PARAMETER)
            return ""
        return ",".join(f'"{name}"' for name in sorted(self.files))

    def _file_key(self, cmd: ScpiCommand) -> str | None:
        path = cmd.arg().upper()
        key = path.rsplit("/", 1)[-1]
        if key not in self.files:
            self.push_error(*ERR_NO_FILE)
            return None
        return key

    def _data_data(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        key = self._file_key(cmd)
        payload = self.files[key] if key is not None else b""
        length = str(len(payload)).encode()
        return b"#" + str(len(length)).encode() + length + payload

    def _data_delete(self, cmd: ScpiCommand, sfx: tuple[int, ...]) -> Reply:
        key = self._file_key(cmd)
        if key is not None:
            del self.files[key]
        return None

