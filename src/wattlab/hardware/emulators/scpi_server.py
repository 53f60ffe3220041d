"""A SCPI instrument on a TCP port: the server, a command matcher, and an emulator base.

Emulators of SCPI analysers subclass ``ScpiDevice``, declare a table of command patterns
in the manual's mixed case (``:NUMeric:NORMal:ITEM#``: the capitals are the short form,
``#`` a numeric suffix), and are reached through real pyvisa-py as
``TCPIP::127.0.0.1::<port>::SOCKET``. Written from PROTOCOLS.md, independent of the
drivers, so tests cross-check two readings of the same facts.

Also here: ``WallLoad``, the AC load both analyser emulators measure (a node's DC power
through a PSU efficiency curve, plus the rest of the node).
"""

from __future__ import annotations

import contextlib
import math
import re
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from wattlab.errors import UsageError

LOCALHOST = "127.0.0.1"
POLL_S = 0.05
MAX_LINE_BYTES = 1 << 16
MAX_ERROR_QUEUE = 30

Reply = str | bytes | None


@dataclass(frozen=True)
class ScpiCommand:
    """One command of a line: header (upper case, no ``?``), query or not, arguments."""

    raw: str
    header: str
    query: bool
    args: tuple[str, ...]

    def arg(self, i: int = 0) -> str:
        """Argument ``i`` with quotes removed ('' when missing)."""
        return self.args[i].strip().strip('"') if i < len(self.args) else ""


def split_outside_quotes(text: str, sep: str) -> list[str]:
    """Split on ``sep`` except inside double quotes."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == sep and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_command(text: str) -> ScpiCommand:
    """``:HEAD:ER? a,b`` → ScpiCommand(header=':HEAD:ER', query=True, args=('a','b'))."""
    stripped = text.strip()
    head, _, rest = stripped.partition(" ")
    query = head.endswith("?")
    header = head.rstrip("?").upper()
    rest = rest.strip()
    args = tuple(a.strip() for a in split_outside_quotes(rest, ",")) if rest else ()
    return ScpiCommand(stripped, header, query, args)


def _node_regex(node: str) -> str:
    # SCPI accepts exactly the short form (the capitals) or the whole long form.
    suffix = node.endswith("#")
    word = node.rstrip("#")
    short = "".join(ch for ch in word if not ch.islower()) or word.upper()
    long = word.upper()
    body = re.escape(long) if short == long else f"(?:{re.escape(long)}|{re.escape(short)})"
    return body + ("([0-9]*)" if suffix else "")


class Pattern:
    """A SCPI header pattern in the manual's mixed case; matches short and long forms."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        query = pattern.endswith("?")
        nodes = pattern.rstrip("?").lstrip(":").split(":")
        self.query = query
        self._regex = re.compile(":?" + ":".join(_node_regex(n) for n in nodes) + "$")

    def match(self, cmd: ScpiCommand) -> tuple[int, ...] | None:
        """Numeric suffixes (default 1) if ``cmd`` is this command, else None."""
        if cmd.query != self.query:
            return None
        m = self._regex.match(cmd.header)
        if m is None:
            return None
        return tuple(int(g) if g else 1 for g in m.groups())


def _quick_ack(conn: socket.socket) -> None:
    # Clients (pyvisa-py) leave Nagle on: a write right after a write waits for our ACK,
    # which Linux delays ~40 ms. Acknowledge at once, as an instrument's stack would.
    quickack = getattr(socket, "TCP_QUICKACK", None)
    if quickack is not None:
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, quickack, 1)


class ScpiTcpServer:
    """Line-based SCPI over TCP on 127.0.0.1: one thread per connection, clean shutdown."""

    def __init__(self, handler: Callable[[ScpiCommand], Reply], port: int = 0) -> None:
        self.handler = handler
        self.stopping = threading.Event()
        self.handler_errors: list[str] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOCALHOST, port))
        self._listener.listen(4)
        self._listener.settimeout(POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"scpi-accept-{self.port}", daemon=True
        )
        self._accept_thread.start()

    @property
    def resource(self) -> str:
        """The VISA resource string pyvisa-py opens."""
        return f"TCPIP::{LOCALHOST}::{self.port}::SOCKET"

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(POLL_S)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(
                target=self._serve, args=(conn,), name=f"scpi-conn-{self.port}", daemon=True
            )
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = bytearray()
        with conn:
            while not self.stopping.is_set():
                try:
                    chunk = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                _quick_ack(conn)
                buffer += chunk
                while b"\n" in buffer:
                    line, _, rest = bytes(buffer).partition(b"\n")
                    buffer = bytearray(rest)
                    reply = self._handle_line(line.decode("latin-1").strip())
                    if reply:
                        try:
                            conn.sendall(reply)
                        except OSError:
                            return
                if len(buffer) > MAX_LINE_BYTES:
                    buffer.clear()

    def _handle_line(self, line: str) -> bytes:
        out: list[bytes] = []
        for part in split_outside_quotes(line, ";"):
            if not part.strip():
                continue
            try:
                reply = self.handler(parse_command(part))
            except Exception as e:  # an emulator bug must not kill the connection
                self.handler_errors.append(f"{part!r}: {e!r}")
                continue
            if isinstance(reply, str):
                out.append(reply.encode("latin-1"))
            elif isinstance(reply, bytes):
                out.append(reply)
        if not out:
            return b""
        return b";".join(out) + b"\n"

    def close(self) -> None:
        """Stop accepting, end every connection thread, close the socket."""
        self.stopping.set()
        self._accept_thread.join(2.0)
        for t in self._threads:
            t.join(2.0)
        self._listener.close()


Action = Callable[[ScpiCommand, tuple[int, ...]], Reply]

BAD_VALUE_TEXT = {
    "nan": "NAN",
    "no_data": "9.91E+37",
    "overrange": "9.9E+37",
    "malformed": "1.2.3E+00",
}


class ScpiDevice:
    """Base of SCPI emulators: dispatch table, error queue, fault injection, serving."""

    COMMAND_PATTERNS: tuple[tuple[str, str], ...] = ()
    UNDEFINED_HEADER = (-113, "Undefined header")

    def __init__(self, idn: str) -> None:
        self.lock = threading.RLock()
        self.idn = idn
        self.errors: deque[tuple[int, str]] = deque(maxlen=MAX_ERROR_QUEUE)
        self._bad_values: deque[str] = deque()
        self._stall_s = 0.0
        self._table = [(Pattern(p), getattr(self, name)) for p, name in self.COMMAND_PATTERNS]
        self._server: ScpiTcpServer | None = None
        self._handler_errors: list[str] = []
        self.stopping = threading.Event()

    # -- serving -------------------------------------------------------------------------
    def start(self) -> ScpiDevice:
        """Listen on a random port of 127.0.0.1."""
        if self._server is None:
            self._server = ScpiTcpServer(self.handle)
            self._handler_errors = self._server.handler_errors
        return self

    @property
    def resource(self) -> str:
        """VISA resource string of the running emulator."""
        if self._server is None:
            raise UsageError("emulator not started")
        return self._server.resource

    @property
    def handler_errors(self) -> list[str]:
        """Exceptions inside command handlers; kept after ``close`` for the tests' check."""
        return self._handler_errors

    def close(self) -> None:
        """Stop serving; interrupts waits and stalls."""
        self.stopping.set()
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> ScpiDevice:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- fault injection ---------------------------------------------------------------
    def inject_error(self, code: int, message: str) -> None:
        """Queue an error as if the last command had failed."""
        with self.lock:
            self.errors.append((code, message))

    def inject_bad_value(self, kind: str, count: int = 1) -> None:
        """Make the next ``count`` readings all ``kind``: nan, no_data, overrange, malformed."""
        if kind not in BAD_VALUE_TEXT:
            raise UsageError(f"bad value kind {kind!r}; one of {', '.join(BAD_VALUE_TEXT)}")
        with self.lock:
            self._bad_values.extend([BAD_VALUE_TEXT[kind]] * count)

    def stall(self, seconds: float) -> None:
        """Delay the next command's handling by ``seconds`` (a hung instrument)."""
        self._stall_s = seconds

    def set_idn(self, idn: str) -> None:
        """Answer ``*IDN?`` with this (e.g. another model)."""
        self.idn = idn

    # -- helpers for subclasses ---------------------------------------------------------
    def push_error(self, code: int, message: str) -> None:
        """Append to the error queue (oldest first, bounded like a real one)."""
        self.errors.append((code, message))

    def pop_error(self) -> tuple[int, str]:
        """Oldest error, or (0, 'No error')."""
        return self.errors.popleft() if self.errors else (0, "No error")

    def take_bad_value(self) -> str | None:
        """The injected bad value for this reading, if any."""
        return self._bad_values.popleft() if self._bad_values else None

    def sleep(self, seconds: float) -> bool:
        """Sleep unless the emulator is closing; True if it is closing."""
        return self.stopping.wait(max(0.0, seconds))

    def handle(self, cmd: ScpiCommand) -> Reply:
        """Dispatch one command; unknown ones queue 'Undefined header' like an instrument."""
        if self._stall_s > 0:
            stall, self._stall_s = self._stall_s, 0.0
            if self.sleep(stall):
                return None
        if cmd.header == "*IDN" and cmd.query:
            return self.idn
        for pattern, action in self._table:
            suffixes = pattern.match(cmd)
            if suffixes is not None:
                with self.lock:
                    return action(cmd, suffixes)
        with self.lock:
            self.push_error(*self.UNDEFINED_HEADER)
        return None


def format_nr3(value: float) -> str:
    """NR3 text like the analysers send (``2.3012E+02``)."""
    return f"{value:.4E}"


def demo_node_power_w(t_ns: int) -> float:
    """A GPU-node-like DC load for demos: 250 W idle, 550 W bursts every 4 s, a slow ripple."""
    t_s = t_ns / 1e9
    burst = 300.0 if (t_s % 4.0) < 2.0 else 0.0
    return 250.0 + burst + 10.0 * math.sin(2 * math.pi * t_s / 7.0)


@dataclass
class WallLoad:
    """What an AC analyser at the wall sees of a node: DC power through a PSU, plus the rest.

    Efficiency is a gentle curve over PSU load (0.90 light, 0.94 at half load, 0.92 full),
    close to an 80 PLUS Platinum supply; voltage ~230 V with a small ripple; PF ~0.98.
    """

    node_power_w: Callable[[int], float] = demo_node_power_w
    rest_w: float = 150.0
    psu_rated_w: float = 2000.0
    voltage_v: float = 230.0
    power_factor: float = 0.98
    frequency_hz: float = 50.0

    def efficiency(self, dc_w: float) -> float:
        """PSU efficiency at a DC load."""
        x = min(max(dc_w / self.psu_rated_w, 0.0), 1.0)
        return 0.94 - 0.04 * (x - 0.5) ** 2 / 0.25 if x < 0.5 else 0.94 - 0.02 * (x - 0.5) / 0.5

    def wall_power_w(self, t_ns: int) -> float:
        """AC active power at one instant."""
        dc_w = max(self.node_power_w(t_ns), 0.0) + self.rest_w
        return dc_w / self.efficiency(dc_w)

    def mean_wall_power_w(self, t0_ns: int, t1_ns: int, points: int = 5) -> float:
        """Mean AC power over an update interval (what an averaging analyser reports)."""
        step = (t1_ns - t0_ns) / points
        return sum(self.wall_power_w(int(t0_ns + (i + 0.5) * step)) for i in range(points)) / points

    def voltage_at(self, t_ns: int) -> float:
        """Line RMS voltage with a slow ±0.5 V wander."""
        return self.voltage_v + 0.5 * math.sin(2 * math.pi * t_ns / 13e9)


def monotonic_ns() -> int:
    """Host monotonic clock (the timebase ``node_power_w`` takes)."""
    return time.monotonic_ns()


def serve_until_interrupted(device: ScpiDevice, name: str) -> int:
    """Serve ``device``, print its VISA resource, stop cleanly on Ctrl-C.

    ``wattlab emulate`` turns SIGTERM into a Ctrl-C and sets the exit status
    (hardware/emulators/emulator_run.py).
    """
    device.start()
    try:
        print(f"{name} emulator: {device.resource}", flush=True)
        print("Ctrl-C to stop", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        device.close()
    return 0


def run_emulator_cli(model: str, node_power_w: Callable[[int], float] | None = None) -> int:
    """``wattlab emulate wt310e|wt332e|wt333e|hmc8015``: serve one emulator until Ctrl-C."""
    from wattlab.hardware.emulators.wt300e_emulator import MODEL_ELEMENTS, Wt300eEmulator

    key = model.upper()
    if key == "HMC8015":
        from wattlab.hardware.emulators.hmc8015_emulator import Hmc8015Emulator

        return serve_until_interrupted(Hmc8015Emulator(node_power_w), key)
    if key not in MODEL_ELEMENTS:
        print(
            f"unknown analyser {model!r}; choose hmc8015 or one of "
            f"{', '.join(m.lower() for m in MODEL_ELEMENTS)}",
            file=sys.stderr,
        )
        return 2
    return serve_until_interrupted(Wt300eEmulator(key, node_power_w), key)
