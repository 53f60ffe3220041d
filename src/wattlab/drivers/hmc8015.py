"""Rohde & Schwarz HMC8015 power analyser over SCPI, with its on-device log.

Facts from PROTOCOLS.md §5 (power-overwhelming's hmc8015 code and the R&S manual). Where
the sources are thin the driver is tolerant and says so: the ``DATA:LIST?`` reply may
name files with or without the ``DATA/`` folder **[unverified]**, and the log CSV layout
(``;`` separators, ``#`` comment lines, a header of function names with optional unit
decorations, ``HH:MM:SS.mmm`` times, decimal point or comma) is parsed loosely.
The HMC8015 offers no update event over SCPI in our sources, so reads are host-paced.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from wattlab.drivers.scpi import (
    Identity,
    ScpiInstrument,
    Setting,
    TextTransport,
    parse_idn,
    parse_number,
    parse_number_list,
    split_scpi_list,
)
from wattlab.errors import MeterError, MeterProtocolError, UsageError
from wattlab.samples import Channel

MODEL = "HMC8015"
MAX_FUNCTIONS = 10


@dataclass(frozen=True)
class HmcFunction:
    """A measurement function: wire name, SI channel, scale to SI, meaning."""

    code: str
    channel: str
    unit: str
    scale: float
    meaning: str


FUNCTIONS: dict[str, HmcFunction] = {
    f.code: f
    for f in (
        HmcFunction("URMS", "voltage_v", "V", 1.0, "RMS voltage"),
        HmcFunction("UAVG", "voltage_avg_v", "V", 1.0, "mean voltage"),
        HmcFunction("IRMS", "current_a", "A", 1.0, "RMS current"),
        HmcFunction("IAVG", "current_avg_a", "A", 1.0, "mean current"),
        HmcFunction("P", "power_w", "W", 1.0, "active power"),
        HmcFunction("S", "apparent_power_va", "VA", 1.0, "apparent power"),
        HmcFunction("Q", "reactive_power_var", "var", 1.0, "reactive power"),
        HmcFunction("LAMB", "power_factor", "1", 1.0, "power factor"),
        HmcFunction("PHI", "phase_rad", "rad", math.pi / 180.0, "phase angle"),
        HmcFunction("FU", "voltage_frequency_hz", "Hz", 1.0, "voltage frequency"),
        HmcFunction("FI", "current_frequency_hz", "Hz", 1.0, "current frequency"),
        HmcFunction("FPLL", "pll_frequency_hz", "Hz", 1.0, "PLL source frequency"),
        HmcFunction("UTHD", "voltage_thd", "1", 0.01, "voltage THD (percent / 100)"),
        HmcFunction("ITHD", "current_thd", "1", 0.01, "current THD (percent / 100)"),
        HmcFunction("TIME", "integration_time_s", "s", 1.0, "integration time"),
        HmcFunction("WH", "energy_j", "J", 3600.0, "integrated energy (Wh x 3600)"),
        HmcFunction("WHP", "energy_pos_j", "J", 3600.0, "positive energy (Wh x 3600)"),
        HmcFunction("WHM", "energy_neg_j", "J", 3600.0, "negative energy (Wh x 3600)"),
        HmcFunction("AH", "charge_c", "C", 3600.0, "integrated charge (Ah x 3600)"),
        HmcFunction("AHP", "charge_pos_c", "C", 3600.0, "positive charge (Ah x 3600)"),
        HmcFunction("AHM", "charge_neg_c", "C", 3600.0, "negative charge (Ah x 3600)"),
        HmcFunction("URAN", "voltage_range_v", "V", 1.0, "voltage range in use"),
        HmcFunction("IRAN", "current_range_a", "A", 1.0, "current range in use"),
    )
}
COMMANDS = {
    "functions": "CHAN1:MEAS:FUNC",
    "values": "CHAN1:MEAS:DATA?",
    "volt_auto": "CHAN1:ACQ:VOLT:RANG:AUTO ON",
    "curr_auto": "CHAN1:ACQ:CURR:RANG:AUTO ON",
    "integ_start": "INT:STAR",
    "integ_stop": "INT:STOP",
    "integ_reset": "INT:RES",
    "log_file": 'LOG:FNAM "{name}",INT',
    "log_state": "LOG:STAT",
    "log_list": "DATA:LIST? INT",
    "log_data": 'DATA:DATA? "DATA/{file}"',
}
_LOG_NAME = re.compile(r"^[A-Za-z0-9_\-]{1,32}$")
_TIME = re.compile(r"^(\d{1,2}):(\d{2}):(\d{2}(?:\.\d*)?)$")
_COLUMN = re.compile(r"^\s*([A-Za-z]+)")


def function_code(name: str) -> str:
    """Wire name of a function (case-insensitive); UsageError if unknown."""
    code = name.strip().upper()
    if code == "LAMBDA":
        code = "LAMB"
    if code not in FUNCTIONS:
        raise UsageError(f"unknown HMC8015 function {name!r}; known: {', '.join(FUNCTIONS)}")
    return code


def function_channels(codes: Sequence[str]) -> list[Channel]:
    """SI channels for HMC functions, in order."""
    return [
        Channel(FUNCTIONS[c].channel, FUNCTIONS[c].unit, f"{FUNCTIONS[c].meaning}, function {c}")
        for c in codes
    ]


def _encode_seconds(driver: Hmc8015, seconds: float) -> str:
    if not (seconds > 0 and math.isfinite(seconds)):
        raise UsageError(f"{driver.resource}: duration {seconds!r} s must be positive")
    return f"{seconds:g}"


def _encode_integration_mode(driver: Hmc8015, mode: str) -> str:
    code = mode.strip().upper()
    code = {"MANUAL": "MAN", "DURATION": "DUR"}.get(code, code)
    if code not in ("MAN", "DUR", "SPAN"):
        raise UsageError(f"{driver.resource}: integrator mode {mode!r} is not MAN, DUR or SPAN")
    return code


def _encode_log_mode(driver: Hmc8015, mode: str) -> str:
    code = mode.strip().upper()
    code = {"UNLIMITED": "UNL", "COUNT": "COUN", "DURATION": "DUR"}.get(code, code)
    if code not in ("UNL", "COUN", "DUR", "SPAN"):
        raise UsageError(f"{driver.resource}: log mode {mode!r} is not UNL, COUN, DUR or SPAN")
    return code


class Hmc8015(ScpiInstrument):
    """An HMC8015 on a ``TextTransport``; ``connect()`` talks to it, ``__init__`` never does."""

    ERROR_QUERY = "SYST:ERR?"

    integration_mode = Setting("INT:MODE", _encode_integration_mode, str, "MAN, DUR or SPAN")
    integration_duration_s = Setting("INT:DUR", _encode_seconds, float, "for mode DUR")
    log_mode = Setting("LOG:MODE", _encode_log_mode, str, "UNL, COUN, DUR or SPAN")
    log_interval_s = Setting("LOG:INT", _encode_seconds, float, "seconds between log rows")

    def __init__(self, transport: TextTransport) -> None:
        super().__init__(transport)
        self.identity: Identity | None = None
        self.functions: list[str] = []

    def connect(self) -> Identity:
        """Identify (model must be HMC8015) and empty the error queue of stale entries."""
        identity = parse_idn(self.transport.query("*IDN?"), self.resource)
        if identity.model.upper() != MODEL:
            raise MeterError(f"{self.resource}: expected a {MODEL}, got {identity.model!r}")
        self.drain_errors()
        self.identity = identity
        return identity

    def set_functions(self, functions: Sequence[str]) -> list[Channel]:
        """Choose what ``read_values`` returns, in order."""
        codes = [function_code(f) for f in functions]
        if not 1 <= len(codes) <= MAX_FUNCTIONS:
            raise UsageError(f"{self.resource}: {len(codes)} functions; 1-{MAX_FUNCTIONS} allowed")
        self.apply(f"{COMMANDS['functions']} {','.join(codes)}")
        self.functions = codes
        return function_channels(codes)

    def auto_range(self) -> None:
        """Voltage and current auto-ranging, so a load step never reads as overrange."""
        self.apply(COMMANDS["volt_auto"])
        self.apply(COMMANDS["curr_auto"])

    def read_values(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.uint8]]:
        """The selected functions' latest values in SI units, with bad-value flags."""
        if not self.functions:
            raise UsageError(f"{self.resource}: set_functions() before read_values()")
        reply = self.transport.query(COMMANDS["values"])
        values, flags = parse_number_list(reply, self.resource, expected=len(self.functions))
        return values * np.array([FUNCTIONS[c].scale for c in self.functions]), flags

    def integration_start(self) -> None:
        """Start the integrator."""
        self.apply(COMMANDS["integ_start"])

    def integration_stop(self) -> None:
        """Stop (hold) the integrator."""
        self.apply(COMMANDS["integ_stop"])

    def integration_reset(self) -> None:
        """Zero the integrator."""
        self.apply(COMMANDS["integ_reset"])

    def log_file(self, name: str) -> str:
        """Name the next on-device log (internal memory); returns the CSV file name."""
        if not _LOG_NAME.match(name):
            raise UsageError(f"{self.resource}: log name {name!r}: use 1-32 letters/digits/_/-")
        self.apply(COMMANDS["log_file"].format(name=name))
        return f"{name}.CSV"

    def log_start(self) -> None:
        """Start logging to the file named by ``log_file`` (runs unattended)."""
        self.apply(f"{COMMANDS['log_state']} ON")

    def log_stop(self) -> None:
        """Stop logging and close the file."""
        self.apply(f"{COMMANDS['log_state']} OFF")

    def list_logs(self) -> list[str]:
        """CSV file names in internal memory (without the ``DATA/`` folder)."""
        reply = self.transport.query(COMMANDS["log_list"])
        self.check_errors(COMMANDS["log_list"])
        names = [f.rsplit("/", 1)[-1] for f in split_scpi_list(reply) if f]
        return [n for n in names if n.upper().endswith(".CSV")]

    def download_log(self, file: str) -> bytes:
        """Raw bytes of one log file (``name.CSV``) from internal memory."""
        name = file.rsplit("/", 1)[-1]
        cmd = COMMANDS["log_data"].format(file=name)
        data = self.transport.query_binary_block(cmd)
        self.check_errors(cmd)
        return data

    def read_log(self, file: str) -> HmcLog:
        """Download and parse one log file into SI arrays."""
        return parse_log_csv(self.download_log(file), f"{self.resource}:{file}")


@dataclass
class HmcLog:
    """An on-device log: times of day (unwrapped past midnight) and SI values per function."""

    time_of_day_s: npt.NDArray[np.float64]
    values: npt.NDArray[np.float64]
    flags: npt.NDArray[np.uint8]
    functions: list[str]
    channels: list[Channel]
    metadata: dict[str, str] = field(default_factory=dict)


def parse_time_of_day(text: str) -> float:
    """``HH:MM:SS.mmm`` → seconds since midnight; ValueError if malformed."""
    m = _TIME.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not HH:MM:SS.mmm")
    hours, minutes, secs = int(m.group(1)), int(m.group(2)), float(m.group(3))
    if hours > 23 or minutes > 59 or secs >= 61:
        raise ValueError(f"{text!r} is not a time of day")
    return hours * 3600 + minutes * 60 + secs


def _column_function(column: str) -> str:
    m = _COLUMN.match(column)
    code = m.group(1).upper() if m else ""
    code = "LAMB" if code == "LAMBDA" else code
    if code not in FUNCTIONS:
        raise ValueError(f"column {column!r} names no HMC8015 function")
    return code


def parse_log_csv(data: bytes, source: str = "log") -> HmcLog:
    """Parse an HMC8015 log CSV; errors name the source and the line."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise MeterProtocolError(f"{source}: log is not text (byte {e.start})") from e
    metadata: dict[str, str] = {}
    codes: list[str] | None = None
    times: list[float] = []
    rows: list[list[float]] = []
    row_flags: list[list[int]] = []
    for line_no, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line:
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            key, sep, value = body.partition(";")
            if not sep:
                key, _, value = body.partition(": ")
            if key.strip():
                metadata[key.strip()] = value.strip().strip(";")
            continue
        fields = [f.strip() for f in line.split(";")]
        while fields and fields[-1] == "":
            fields.pop()
        if codes is None:
            try:
                codes = [_column_function(c) for c in fields[1:]]
            except ValueError as e:
                raise MeterProtocolError(f"{source}: line {line_no}: header: {e}") from e
            if not codes:
                raise MeterProtocolError(f"{source}: line {line_no}: header has no functions")
            continue
        if len(fields) != len(codes) + 1:
            raise MeterProtocolError(
                f"{source}: line {line_no}: {len(fields)} fields, header has {len(codes) + 1}"
            )
        try:
            t_s = parse_time_of_day(fields[0])
        except ValueError as e:
            raise MeterProtocolError(f"{source}: line {line_no}: {e}") from e
        values: list[float] = []
        flags: list[int] = []
        for i, cell in enumerate(fields[1:], start=1):
            try:
                number, flag = parse_number(cell.replace(",", "."), source, line, i)
            except MeterProtocolError as e:
                raise MeterProtocolError(f"{source}: line {line_no}: {e}") from e
            values.append(number * FUNCTIONS[codes[i - 1]].scale)
            flags.append(int(flag))
        times.append(t_s)
        rows.append(values)
        row_flags.append(flags)
    if codes is None:
        raise MeterProtocolError(f"{source}: log has no header line")
    t = np.array(times, dtype=np.float64)
    if t.size > 1:
        # A log that runs past midnight starts again at 00:00:00: unwrap by days.
        t = t + 86400.0 * np.concatenate([[0], np.cumsum(np.diff(t) < -43200.0)])
    # One flag byte per row: the OR of its cells' SampleFlag bits.
    flags_any = np.array(
        [int(np.bitwise_or.reduce(f)) if f else 0 for f in row_flags], dtype=np.uint8
    )
    values_arr = np.array(rows, dtype=np.float64).reshape(len(rows), len(codes))
    return HmcLog(t, values_arr, flags_any, codes, function_channels(codes), metadata)
