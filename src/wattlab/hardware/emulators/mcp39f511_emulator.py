"""A Microchip MCP39F511N demo board on a pseudo-terminal, written from the register map.

It shares no code with the driver, so the integration tests cross-check two readings of
the same description. The chip holds a register file; every accumulation interval (2^N
line cycles of a 50 Hz mains) it writes new outputs for the interval that just ended —
mean active power of a waveform ``power_w(t_ns)`` split over its two channels, with a
little noise — and adds the interval's energy to the u64 accumulators when accumulation
is switched on. Frames are parsed as the chip would: header, length, checksum (a bad one
answers CSFAIL), then the chained commands. Faults for tests: NAK, a reply with a wrong
checksum, a reply cut short.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from wattlab.hardware.emulators.pty_device import PtyDevice, serve_until_interrupted

ACK, NAK, CSFAIL = 0x06, 0x15, 0x51
STATUS, VERSION, VOLTS, FREQ, PF, IRMS, P, Q, S = 2, 4, 6, 8, 10, 14, 22, 30, 38
IMPORT_P, EXPORT_P, IMPORT_Q, EXPORT_Q = 46, 62, 78, 94
CONFIG, ACC_N = 0xA0, 0xA8
REGISTER_BYTES = 0x100
ENERGY_BITS = 0x300  # system configuration bits 8 and 9
FACTORY_N = 4
FRAME_STALE_NS = 50_000_000  # a partial frame older than this is dropped
SAMPLES_PER_INTERVAL = 8

PowerFn = Callable[[Any], Any]


class Mcp39f511Emulator(PtyDevice):
    """The chip: register file, periodic output updates, energy accumulators, faults."""

    def __init__(self, power_w: PowerFn, seed: int = 0, *, line_hz: float = 50.0,
                 volts: float = 230.0, shares: Sequence[float] = (1.0, 0.0),
                 power_factor: float = 0.95, noise_w: float = 0.3,
                 energy_unit_j: float = 3.6, version: int = 0x5A15,
                 accumulation_n: int = FACTORY_N, energy_on: bool = False) -> None:
        super().__init__("mcp39f511n")
        self.power_fn = power_w
        self.line_hz = line_hz
        self.volts = volts
        self.shares = tuple(float(s) for s in shares)
        self.power_factor = power_factor
        self.noise_w = noise_w
        self.energy_unit_j = energy_unit_j
        self.regs = bytearray(REGISTER_BYTES)
        self._put(VERSION, "<H", version)
        self._put(ACC_N, "<H", accumulation_n)
        self._put(CONFIG, "<I", ENERGY_BITS if energy_on else 0)
        self.eeprom = bytearray(512)
        self.flash_saves = 0
        self.updates = 0
        self.updates_hidden = 0  # overwritten in the same tick (a late thread): never visible
        self.frames: list[bytes] = []
        self._rng = np.random.default_rng(seed)
        self._carry = [0.0, 0.0]  # energy below one count, per channel, not yet counted
        self._rx = bytearray()
        self._rx_since_ns = 0
        self._next_update_ns = 0
        self._faults: dict[str, int] = {"nak": 0, "bad_checksum": 0, "short": 0}
        self._lock = threading.Lock()

    # -- faults (any thread) ---------------------------------------------------------------
    def inject(self, fault: str, count: int = 1) -> None:
        """The next ``count`` frames get: ``nak``, ``bad_checksum`` or a ``short`` reply."""
        if fault not in self._faults:
            raise ValueError(f"unknown fault {fault!r}; one of {', '.join(self._faults)}")
        with self._lock:
            self._faults[fault] += count

    def _take_fault(self) -> str | None:
        with self._lock:
            for name, left in self._faults.items():
                if left:
                    self._faults[name] = left - 1
                    return name
        return None

    # -- register file ---------------------------------------------------------------------
    def _put(self, address: int, fmt: str, *values: Any) -> None:
        struct.pack_into(fmt, self.regs, address, *values)

    def register(self, address: int, fmt: str) -> Any:
        """A register's value, ``fmt`` a struct format such as ``"<H"`` (tests look here)."""
        return struct.unpack_from(fmt, self.regs, address)[0]

    @property
    def interval_ns(self) -> int:
        """2^N line cycles."""
        return round((1 << self.register(ACC_N, "<H")) * 1e9 / self.line_hz)

    def accumulated_j(self, channel: int) -> float:
        """Import-active energy counted so far (whole counts), in joules."""
        return int(self.register(IMPORT_P + 8 * channel, "<Q")) * self.energy_unit_j

    def _mean_power_w(self, t0_ns: int, t1_ns: int) -> float:
        t = np.linspace(t0_ns, t1_ns, SAMPLES_PER_INTERVAL, dtype=np.int64)
        try:
            values = np.asarray(self.power_fn(t), dtype=np.float64)
            if values.shape != t.shape:
                raise ValueError
        except (TypeError, ValueError):
            values = np.array([float(self.power_fn(int(x))) for x in t])
        return float(values.mean())

    def _update(self, t_end_ns: int) -> None:
        """Outputs for the interval ending at ``t_end_ns``; energy into the accumulators."""
        interval = self.interval_ns
        total = self._mean_power_w(t_end_ns - interval, t_end_ns)
        status = 0
        for ch, share in enumerate(self.shares):
            p = total * share + float(self._rng.normal(0.0, self.noise_w))
            s = abs(p) / self.power_factor
            q = (s * s - p * p) ** 0.5
            status |= (0x10 if p >= 0 else 0) << (2 * ch) | (0x20 << (2 * ch))
            self._put(P + 4 * ch, "<I", round(abs(p) * 100))
            self._put(Q + 4 * ch, "<I", round(q * 100))
            self._put(S + 4 * ch, "<I", round(s * 100))
            self._put(IRMS + 4 * ch, "<I", round(s / self.volts * 1e4))
            self._put(PF + 2 * ch, "<h", round(32767 * (p / s if s else 1.0)))
            if self.register(CONFIG, "<I") & (0x100 << ch):
                self._accumulate(ch, p * interval / 1e9)
        self._put(STATUS, "<H", status)
        self._put(VOLTS, "<H", round(self.volts * 10))
        self._put(FREQ, "<H", round(self.line_hz * 1000))
        self.updates += 1

    def _accumulate(self, ch: int, energy_j: float) -> None:
        target = IMPORT_P if energy_j >= 0 else EXPORT_P
        self._carry[ch] += abs(energy_j) / self.energy_unit_j
        whole = int(self._carry[ch])
        self._carry[ch] -= whole
        self._put(target + 8 * ch, "<Q", self.register(target + 8 * ch, "<Q") + whole)

    # -- device thread -----------------------------------------------------------------------
    def on_start(self, now_ns: int) -> None:
        """A real board has been running before the host opens it: outputs are there."""
        self._update(now_ns)
        self._next_update_ns = now_ns + self.interval_ns

    def tick(self, now_ns: int) -> None:
        due = 0
        while now_ns >= self._next_update_ns:
            self._update(self._next_update_ns)
            self._next_update_ns += self.interval_ns
            due += 1
        self.updates_hidden += max(due - 1, 0)

    def on_bytes(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if self._rx and now - self._rx_since_ns > FRAME_STALE_NS:
            self._rx.clear()  # the rest of that frame never came
        if not self._rx:
            self._rx_since_ns = now
        self._rx += data
        while self._rx:
            if self._rx[0] != 0xA5:  # not a frame start: skipped, as line noise
                del self._rx[0]
                self._rx_since_ns = now
                continue
            if len(self._rx) < 2 or len(self._rx) < self._rx[1]:
                return
            size = max(self._rx[1], 3)
            raw = bytes(self._rx[:size])
            del self._rx[:size]
            self._rx_since_ns = now
            self.frames.append(raw)
            self._frame(raw)

    def _frame(self, raw: bytes) -> None:
        if len(raw) < 4 or sum(raw[:-1]) & 0xFF != raw[-1]:
            self.send(bytes([CSFAIL]))
            return
        fault = self._take_fault()
        if fault == "nak":
            self.send(bytes([NAK]))
            return
        reply = self._commands(raw[2:-1])
        if reply is None:
            self.send(bytes([NAK]))
            return
        out = bytes([ACK])
        if reply:
            body = bytes([ACK, len(reply) + 3]) + reply
            out = body + bytes([sum(body) & 0xFF])
            if fault == "bad_checksum":
                out = out[:-1] + bytes([(out[-1] + 1) & 0xFF])
            elif fault == "short":
                out = out[: len(out) // 2]
        self.send(out)

    def _commands(self, body: bytes) -> bytes | None:
        """Run chained commands; the data a read returns, b"" if none, None for a NAK."""
        pointer, out, i = 0, b"", 0
        while i < len(body):
            cmd = body[i]
            if cmd == 0x41 and i + 3 <= len(body):
                pointer = (body[i + 1] << 8) | body[i + 2]
                i += 3
            elif cmd == 0x4E and i + 2 <= len(body):
                n = body[i + 1]
                if n == 0 or n > 32 or pointer + n > REGISTER_BYTES:
                    return None
                out += bytes(self.regs[pointer:pointer + n])
                i += 2
            elif cmd == 0x4D and i + 2 <= len(body) and i + 2 + body[i + 1] <= len(body):
                n = body[i + 1]
                if pointer + n > REGISTER_BYTES:
                    return None
                self.regs[pointer:pointer + n] = body[i + 2:i + 2 + n]
                i += 2 + n
                if pointer <= ACC_N < pointer + n:
                    self._next_update_ns = time.monotonic_ns() + self.interval_ns
            elif cmd == 0x53:
                self.flash_saves += 1
                i += 1
            elif cmd == 0x42 and i + 2 <= len(body) and body[i + 1] < 32:
                out += bytes(self.eeprom[16 * body[i + 1]:16 * body[i + 1] + 16])
                i += 2
            elif cmd == 0x50 and i + 18 <= len(body) and body[i + 1] < 32:
                self.eeprom[16 * body[i + 1]:16 * body[i + 1] + 16] = body[i + 2:i + 18]
                i += 18
            else:
                return None
        return out


def _demo_power_w(t_ns: Any) -> Any:
    """A 120 W idle server with 300 W bursts at 0.5 Hz."""
    return np.where((np.asarray(t_ns) // 1_000_000_000) % 2 == 0, 120.0, 420.0)


def run_emulator_cli(power_w: PowerFn | None = None, seed: int = 0) -> int:
    """Run the demo board until Ctrl-C, printing the port a driver should open."""
    return serve_until_interrupted(Mcp39f511Emulator(power_w or _demo_power_w, seed=seed))
