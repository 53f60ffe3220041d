"""SCPI over VISA: a text transport, and the parsers every SCPI power analyser shares.

Drivers get a ``TextTransport`` and never open VISA themselves, so protocol tests can hand
them a scripted fake and integration tests the real pyvisa-py socket. Foreign pyvisa
errors become ``MeterTimeoutError`` / ``MeterError`` naming the resource here, once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, overload

import numpy as np
import numpy.typing as npt

from wattlab.errors import MeterError, MeterProtocolError, MeterTimeoutError
from wattlab.samples import SampleFlag

DEFAULT_TIMEOUT_MS = 2000
TERMINATION = "\n"

# IEEE 488.2 "not a number" and the analysers' overrange marker (WT1600 manual IM 760101-11E).
NO_DATA_VALUE = 9.91e37
OVERRANGE_VALUE = 9.9e37
_MARKER_TOLERANCE = 1e34
_HUGE = 9.0e37
_NR3 = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[Ee][+-]?\d+)?$")


class TextTransport(Protocol):
    """What a SCPI driver needs: line-based writes and queries, and binary blocks."""

    resource_name: str

    def write(self, cmd: str) -> None:
        """Send one command line (the transport adds the termination)."""
        ...

    def query(self, cmd: str) -> str:
        """Send ``cmd`` and return the reply line without its termination."""
        ...

    def query_binary_block(self, cmd: str) -> bytes:
        """Send ``cmd`` and return the payload of the definite-length block it answers."""
        ...

    def close(self) -> None:
        """Release the instrument."""
        ...


class ScpiTransport:
    """A VISA message resource opened through pyvisa (pyvisa-py ``@py`` by default)."""

    def __init__(
        self,
        resource_name: str,
        resource_manager: Any = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        import pyvisa

        self.resource_name = resource_name
        self._own_rm = resource_manager is None
        try:
            rm: Any = resource_manager
            if rm is None:
                rm = pyvisa.ResourceManager("@py")
        except (pyvisa.Error, OSError, ValueError) as e:
            raise MeterError(f"{resource_name}: cannot start the VISA library: {e}") from e
        self._rm = rm
        try:
            res: Any = rm.open_resource(resource_name)
            res.read_termination = TERMINATION
            res.write_termination = TERMINATION
            res.timeout = timeout_ms
            self._res = res
        except (pyvisa.Error, OSError, ValueError) as e:
            self._close_rm()
            raise MeterError(f"{resource_name}: cannot open VISA resource: {e}") from e

    @property
    def timeout_ms(self) -> int:
        """VISA timeout; callers raise it where the instrument legitimately waits."""
        return int(self._res.timeout)

    @timeout_ms.setter
    def timeout_ms(self, value: int) -> None:
        self._res.timeout = value

    def _convert(self, e: Exception, cmd: str) -> MeterError:
        import pyvisa

        timeout = pyvisa.constants.StatusCode.error_timeout
        if isinstance(e, pyvisa.VisaIOError) and e.error_code == timeout:
            return MeterTimeoutError(
                f"{self.resource_name}: no reply to {cmd!r} within {self.timeout_ms} ms"
            )
        return MeterError(f"{self.resource_name}: VISA I/O failed on {cmd!r}: {e}")

    def write(self, cmd: str) -> None:
        """Send one command line."""
        import pyvisa

        try:
            self._res.write(cmd)
        except (pyvisa.Error, OSError) as e:
            raise self._convert(e, cmd) from e

    def query(self, cmd: str) -> str:
        """Send ``cmd``, return the reply line."""
        import pyvisa

        try:
            self._res.write(cmd)
            return str(self._res.read()).rstrip("\r\n")
        except (pyvisa.Error, OSError) as e:
            raise self._convert(e, cmd) from e
        except UnicodeDecodeError as e:
            raise MeterProtocolError(
                f"{self.resource_name}: reply to {cmd!r} is not text (byte {e.start})"
            ) from e

    def query_binary_block(self, cmd: str) -> bytes:
        """Send ``cmd``, read ``#<n><len><bytes>`` + newline by counts, not lines."""
        import pyvisa

        try:
            self._res.write(cmd)
            head = self._res.read_bytes(2)
            n_digits = _block_digit_count(head, self.resource_name, cmd)
            length_text = self._res.read_bytes(n_digits)
            length = _block_length(length_text, self.resource_name, cmd)
            payload = bytes(self._res.read_bytes(length)) if length else b""
            tail = self._res.read_bytes(1)
        except (pyvisa.Error, OSError) as e:
            raise self._convert(e, cmd) from e
        if tail != TERMINATION.encode():
            raise MeterProtocolError(
                f"{self.resource_name}: block answering {cmd!r} ends with {tail!r}, not a newline"
            )
        return payload

    def _close_rm(self) -> None:
        if self._own_rm:
            self._rm.close()

    def close(self) -> None:
        """Close the resource, and the resource manager if this transport opened it."""
        import pyvisa

        try:
            self._res.close()
        except (pyvisa.Error, OSError):
            pass
        finally:
            self._close_rm()


def _block_digit_count(head: bytes, resource: str, cmd: str) -> int:
    if len(head) != 2 or head[:1] != b"#" or not head[1:2].isdigit() or head[1:2] == b"0":
        raise MeterProtocolError(
            f"{resource}: reply to {cmd!r} is not a definite-length block: starts {head!r}"
        )
    return int(head[1:2])


def _block_length(text: bytes, resource: str, cmd: str) -> int:
    if not text.isdigit():
        raise MeterProtocolError(
            f"{resource}: block answering {cmd!r} has a bad length field {text!r} at byte 2"
        )
    return int(text)


def decode_definite_block(data: bytes, resource: str = "instrument", cmd: str = "") -> bytes:
    """Payload of a complete IEEE 488.2 block ``#<n><len><bytes>`` (+ newline) in memory."""
    n_digits = _block_digit_count(data[:2], resource, cmd)
    length_text = data[2 : 2 + n_digits]
    if len(length_text) < n_digits:
        raise MeterProtocolError(f"{resource}: block answering {cmd!r} is truncated at byte 2")
    length = _block_length(length_text, resource, cmd)
    start = 2 + n_digits
    payload = data[start : start + length]
    if len(payload) < length:
        raise MeterProtocolError(
            f"{resource}: block answering {cmd!r} announces {length} bytes, "
            f"got {len(payload)} (ends at byte {len(data)})"
        )
    rest = data[start + length :]
    if rest not in (b"", b"\n", b"\r\n"):
        raise MeterProtocolError(
            f"{resource}: {len(rest)} stray bytes after the block answering {cmd!r} "
            f"at byte {start + length}"
        )
    return payload


def encode_definite_block(payload: bytes) -> bytes:
    """``#<n><len><payload>`` (for fakes and emulators of tests)."""
    length = str(len(payload)).encode()
    return b"#" + str(len(length)).encode() + length + payload


def parse_number(field: str, resource: str, reply: str, index: int) -> tuple[float, SampleFlag]:
    """One NR1/NR2/NR3 field; the bad-value markers become NaN with a flag, never a number."""
    text = field.strip()
    upper = text.upper()
    if upper in ("NAN", "+NAN", "-NAN"):
        return math.nan, SampleFlag.NO_DATA
    if upper in ("INF", "+INF", "-INF"):
        return math.nan, SampleFlag.OVERRANGE
    if not _NR3.match(text):
        raise MeterProtocolError(
            f"{resource}: field {index} {field!r} of reply {reply[:200]!r} is not a number"
        )
    value = float(text)
    magnitude = abs(value)
    if abs(magnitude - OVERRANGE_VALUE) < _MARKER_TOLERANCE:
        return math.nan, SampleFlag.OVERRANGE
    if magnitude >= _HUGE:
        return math.nan, SampleFlag.NO_DATA
    return value, SampleFlag.NONE


def parse_number_list(
    reply: str, resource: str = "instrument", expected: int | None = None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.uint8]]:
    """Comma-separated numbers → values and per-value flags (``NAN``/9.91E+37/9.9E+37 → NaN)."""
    fields = reply.strip().split(",")
    if expected is not None and len(fields) != expected:
        raise MeterProtocolError(
            f"{resource}: expected {expected} values, got {len(fields)} in {reply[:200]!r}"
        )
    values = np.empty(len(fields), dtype=np.float64)
    flags = np.zeros(len(fields), dtype=np.uint8)
    for i, field in enumerate(fields):
        value, flag = parse_number(field, resource, reply, i)
        values[i] = value
        flags[i] = int(flag)
    return values, flags


def parse_error_reply(reply: str, resource: str = "instrument") -> tuple[int, str]:
    """``<code>,"<message>"`` (or a bare code when messages are off) → (code, message)."""
    text = reply.strip()
    code_text, _, message = text.partition(",")
    try:
        code = int(code_text.strip())
    except ValueError as e:
        raise MeterProtocolError(f"{resource}: error queue reply {reply!r} has no code") from e
    return code, message.strip().strip('"')


def split_scpi_list(reply: str) -> list[str]:
    """Comma-separated fields, with commas inside double quotes kept; quotes removed."""
    fields: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in reply.strip():
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            fields.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if current or fields:
        fields.append("".join(current).strip())
    return fields


@dataclass(frozen=True)
class Identity:
    """What ``*IDN?`` says: the descriptor's model, serial and firmware come from here."""

    manufacturer: str
    model: str
    serial: str
    firmware: str


def parse_idn(reply: str, resource: str = "instrument") -> Identity:
    """``*IDN?`` → manufacturer, model, serial, firmware."""
    parts = [p.strip() for p in reply.strip().split(",")]
    if len(parts) < 2 or not parts[1]:
        raise MeterProtocolError(f"{resource}: *IDN? reply {reply!r} names no model")
    parts += [""] * (4 - len(parts))
    return Identity(parts[0], parts[1], parts[2], ",".join(parts[3:]))


class ScpiError(MeterError):
    """The instrument's error queue reported a failure; ``code`` and ``message`` as it said."""

    def __init__(
        self, resource: str, command: str, code: int, message: str, more: str = ""
    ) -> None:
        self.resource = resource
        self.command = command
        self.code = code
        self.message = message
        super().__init__(f'{resource}: {command!r} failed: error {code} "{message}"{more}')


MAX_QUEUED_ERRORS = 32
T = TypeVar("T")


class Setting(Generic[T]):
    """A value the instrument holds, declared as data (write, then read the error queue).

    ``encode(driver, value)`` validates and formats against the driver's model;
    ``decode(reply)`` turns the query reply back into the value.
    """

    def __init__(
        self,
        command: str,
        encode: Callable[[Any, T], str],
        decode: Callable[[str], T],
        doc: str = "",
    ) -> None:
        self.command = command
        self.encode = encode
        self.decode = decode
        self.__doc__ = doc
        self.name = command

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, obj: ScpiInstrument, owner: type) -> T: ...

    def __get__(self, obj: ScpiInstrument | None, owner: type) -> Setting[T] | T:
        if obj is None:
            return self
        reply = obj.transport.query(f"{self.command}?")
        try:
            return self.decode(reply)
        except (ValueError, IndexError) as e:
            raise MeterProtocolError(
                f"{obj.transport.resource_name}: {self.command}? answered {reply!r}: {e}"
            ) from e

    def __set__(self, obj: ScpiInstrument, value: T) -> None:
        obj.apply(f"{self.command} {self.encode(obj, value)}")


class ScpiInstrument:
    """Base of SCPI drivers: holds the transport, applies settings, reads the error queue."""

    ERROR_QUERY = "SYST:ERR?"

    def __init__(self, transport: TextTransport) -> None:
        self.transport = transport

    @property
    def resource(self) -> str:
        """The VISA resource name, for error messages."""
        return self.transport.resource_name

    def apply(self, cmd: str) -> None:
        """Write a setting or action and fail loudly if the instrument refused it."""
        self.transport.write(cmd)
        self.check_errors(cmd)

    def read_error(self) -> tuple[int, str]:
        """Pop one entry of the instrument's error queue."""
        return parse_error_reply(self.transport.query(self.ERROR_QUERY), self.resource)

    def check_errors(self, cmd: str) -> None:
        """Raise ``ScpiError`` for the first queued error; drain the rest so none is stale."""
        code, message = self.read_error()
        if code == 0:
            return
        others: list[str] = []
        for _ in range(MAX_QUEUED_ERRORS):
            more_code, more_message = self.read_error()
            if more_code == 0:
                break
            others.append(f'{more_code} "{more_message}"')
        more = f" (then {', '.join(others)})" if others else ""
        raise ScpiError(self.resource, cmd, code, message, more)

    def drain_errors(self) -> list[tuple[int, str]]:
        """Empty the queue of errors left by an earlier session, returning them."""
        stale: list[tuple[int, str]] = []
        for _ in range(MAX_QUEUED_ERRORS):
            code, message = self.read_error()
            if code == 0:
                break
            stale.append((code, message))
        return stale

    def close(self) -> None:
        """Release the transport."""
        self.transport.close()
