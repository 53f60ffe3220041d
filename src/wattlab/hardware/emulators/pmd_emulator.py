"""An ElmorLabs PMD-USB on a pseudo-terminal: the exact bytes of PROTOCOLS.md §3.

Written from the protocol description only (it shares no code with the driver), so the
integration tests cross-check two independent readings of the same document. Readings
come from a board power waveform ``power_w(t_ns)`` split over PCIE1, PCIE2, EPS1 and EPS2
at ~12 V with a little noise. Continuous mode is paced by what the current baud rate can
carry (10 bits a byte in 8N1), produced in blocks per tick so the CPU cost stays small.
"""

from __future__ import annotations

import argparse
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.hardware.emulators.pty_device import PtyDevice, serve_until_interrupted

WELCOME = b"ElmorLabs PMD-USB"
VENDOR = 0xEE
PRODUCT = 0x0A
RAIL_NAMES = (b"PCIE1", b"PCIE2", b"EPS1", b"EPS2")
DEFAULT_SHARES = (0.4, 0.4, 0.2, 0.0)
DEFAULT_ADC_OFFSET = (2, -1, 0, 1, -2, 0, 1, -1)
V_LSB = 0.007568
A_LSB = 0.0488
TICKS_PER_S = 3_000_000
ARG_BYTES = {0x07: 3, 0x08: 16}  # bytes that follow these command bytes
MAX_BACKLOG_NS = 50_000_000  # frames due longer ago than this (after a stall) are lost

PowerFn = Callable[[Any], Any]


def ccitt_false(data: bytes) -> int:
    """CRC-16/CCITT-FALSE, table-free: poly 0x1021, start 0xFFFF."""
    reg = 0xFFFF
    for byte in data:
        for bit in range(7, -1, -1):
            top = (reg >> 15) ^ ((byte >> bit) & 1)
            reg = (reg << 1) & 0xFFFF
            if top:
                reg ^= 0x1021
    return reg


class PmdEmulator(PtyDevice):
    """The device: command parser, config store, baud-paced continuous stream, faults."""

    def __init__(
        self,
        power_w: PowerFn,
        firmware: int = 6,
        seed: int = 0,
        *,
        adc_offset: Sequence[int] = DEFAULT_ADC_OFFSET,
        adc_gain_offset: Sequence[int] = (0,) * 8,
        rail_v: float = 12.0,
        voltage_noise_v: float = 0.02,
        current_noise_a: float = 0.03,
        shares: Sequence[float] = DEFAULT_SHARES,
        welcome_extra: bytes = b"",
    ) -> None:
        super().__init__("pmd-usb")
        self.power_fn = power_w
        self.firmware = firmware
        self.adc_offset = list(adc_offset)
        self.adc_gain_offset = list(adc_gain_offset)
        self.rail_v = rail_v
        self.voltage_noise_v = voltage_noise_v
        self.current_noise_a = current_noise_a
        self.shares = np.asarray(shares, dtype=np.float64)
        self.welcome_extra = welcome_extra
        self._rng = np.random.default_rng(seed)
        self.tick_offset = int(self._rng.integers(0, 1 << 31))
        self._vectorised: bool | None = None
        self._rx = bytearray()
        self.baud = 115200
        self.baud_history: list[tuple[int, int, int, int]] = []
        self.streaming = False
        self.ts_bytes = 0
        self.mask = 0
        self._next_frame_ns = 0
        self.stream_started_ns = 0
        self.frames_sent = 0
        self.frames_lost = 0
        self.bytes_dropped = 0
        self.garbage_inserted = 0
        self.commands: list[bytes] = []
        self._drop_pending = 0
        self._corrupt_pending = 0
        self._fault_lock = threading.Lock()

    # -- faults (any thread) ---------------------------------------------------------------
    def inject_drop_bytes(self, n: int) -> None:
        """Lose the first ``n`` bytes of the next streamed block (a frame cut short)."""
        with self._fault_lock:
            self._drop_pending += n

    def inject_corrupt_bytes(self, n: int) -> None:
        """Insert ``n`` random bytes before the next streamed block (line noise)."""
        with self._fault_lock:
            self._corrupt_pending += n

    # -- the device's view of the world ----------------------------------------------------
    @property
    def frame_bytes(self) -> int:
        return self.ts_bytes + 2 * bin(self.mask).count("1")

    @property
    def frame_period_ns(self) -> float:
        """The line carries baud/10 bytes a second; frames go out as fast as that allows."""
        return 1e9 * 10 * max(self.frame_bytes, 1) / self.baud

    def device_ticks(self, t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Free-running 3 MHz counter (not wrapped) for host times ``t_ns``."""
        return (t_ns * 3) // 1000 + self.tick_offset

    def _power(self, t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        if self._vectorised is not False:
            try:
                out = np.asarray(self.power_fn(t_ns), dtype=np.float64)
                if out.shape == t_ns.shape:
                    self._vectorised = True
                    return out
            except (TypeError, ValueError):
                pass
            self._vectorised = False
        return np.array([float(self.power_fn(int(t))) for t in t_ns], dtype=np.float64)

    def rails(self, t_ns: npt.NDArray[np.int64]) -> tuple[
            npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Volts and amps (n × 4 each) of PCIE1, PCIE2, EPS1, EPS2 at ``t_ns``."""
        n = t_ns.shape[0]
        volts = self.rail_v + self._rng.normal(0.0, self.voltage_noise_v, (n, 4))
        watts = self._power(t_ns)[:, None] * self.shares[None, :]
        amps = watts / volts + self._rng.normal(0.0, self.current_noise_a, (n, 4))
        return volts, np.maximum(amps, 0.0)

    # -- replies ------------------------------------------------------------------------------
    def config_bytes(self) -> bytes:
        """The config struct (pack 2) with its CRC over AdcOffset … rsvd."""
        v5 = self.firmware >= 6
        body = struct.pack("<8b", *self.adc_offset)
        body += struct.pack("<BxHBBBBBBB", 0, 100, 0, 2, 0, 0, 0, 0, 1)
        if v5:
            body += struct.pack("<8b", *self.adc_gain_offset)
        body += b"\0\0\0"
        return struct.pack("<BxH", 5 if v5 else 4, ccitt_false(body)) + body

    def readings_bytes(self, now_ns: int) -> bytes:
        volts, amps = self.rails(np.array([now_ns], dtype=np.int64))
        vals = []
        for r in range(4):
            vals += [round(volts[0, r] * 100), round(amps[0, r] * 10)]
        return struct.pack("<8h", *vals)

    def sensors_bytes(self, now_ns: int) -> bytes:
        volts, amps = self.rails(np.array([now_ns], dtype=np.int64))
        out = b""
        for r, name in enumerate(RAIL_NAMES):
            v, a = float(volts[0, r]), float(amps[0, r])
            out += name.ljust(6, b"\0") + struct.pack(
                "<HHH", round(v * 100), round(a * 10), round(v * a))
        return out

    def adc_words(self, t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """u16 words (n × 8): 12-bit two's complement, minus the stored offset, shifted by 4."""
        volts, amps = self.rails(t_ns)
        phys = np.empty((t_ns.shape[0], 8))
        phys[:, 0::2], phys[:, 1::2] = volts / V_LSB, amps / A_LSB
        counts = np.rint(phys) - np.asarray(self.adc_offset)[None, :]
        counts = np.clip(counts, -2048, 2047).astype(np.int64)
        return (counts & 0xFFF) << 4

    def frames(self, t_ns: npt.NDArray[np.int64]) -> bytes:
        """Frames for times ``t_ns``: ts_bytes of tick counter, then each enabled word."""
        n = t_ns.shape[0]
        cols = [b for b in range(8) if self.mask & (1 << b)]
        out = np.empty((n, self.frame_bytes), dtype=np.uint8)
        ticks = self.device_ticks(t_ns)
        for j in range(self.ts_bytes):
            out[:, j] = (ticks >> (8 * j)) & 0xFF
        words = self.adc_words(t_ns)
        for k, b in enumerate(cols):
            out[:, self.ts_bytes + 2 * k] = words[:, b] & 0xFF
            out[:, self.ts_bytes + 2 * k + 1] = words[:, b] >> 8
        return out.tobytes()

    # -- command handling (device thread) ----------------------------------------------------
    def on_start(self, now_ns: int) -> None:
        self._next_frame_ns = now_ns

    def on_bytes(self, data: bytes) -> None:
        self._rx += data
        while self._rx:
            need = 1 + ARG_BYTES.get(self._rx[0], 0)
            if len(self._rx) < need:
                return
            cmd = bytes(self._rx[:need])
            del self._rx[:need]
            self.commands.append(cmd)
            self._command(cmd)

    def _command(self, cmd: bytes) -> None:
        now_ns = time.monotonic_ns()
        c = cmd[0]
        if c == 0x00:
            self.send(WELCOME + self.welcome_extra)
        elif c == 0x01:
            self.send(bytes([VENDOR, PRODUCT, self.firmware]))
        elif c == 0x02:
            self.send(self.sensors_bytes(now_ns))
        elif c == 0x03:
            self.send(self.readings_bytes(now_ns))
        elif c == 0x04:
            self.send(self.config_bytes())
        elif c == 0x06:
            words = self.adc_words(np.array([now_ns], dtype=np.int64))[0]
            self.send(struct.pack("<8H", *(int(w) for w in words)))
        elif c == 0x07:
            self._flush_due(now_ns)
            enable, ts_bytes, mask = cmd[1], cmd[2], cmd[3]
            if enable and mask and ts_bytes in (0, 1, 2, 4):
                self.ts_bytes, self.mask = ts_bytes, mask
                self.streaming = True
                self._next_frame_ns = now_ns
                self.stream_started_ns = now_ns
            else:
                self.streaming = False
        elif c == 0x08:
            baud, parity, width, stop = struct.unpack("<IIII", cmd[1:])
            self._flush_due(now_ns)
            self.baud_history.append((baud, parity, width, stop))
            self.baud = baud  # a pty has no line rate: only the pacing changes
        elif c == 0xF0:
            self.streaming = False
            self._rx.clear()
        # F1 would enter the bootloader and FF is a no-op; other bytes are ignored.

    def tick(self, now_ns: int) -> None:
        self._flush_due(now_ns)

    def _flush_due(self, now_ns: int) -> None:
        """Send every frame due by ``now_ns`` in one block."""
        if not self.streaming or now_ns < self._next_frame_ns:
            return
        period = self.frame_period_ns
        if now_ns - self._next_frame_ns > MAX_BACKLOG_NS:
            lost = int((now_ns - MAX_BACKLOG_NS - self._next_frame_ns) // period)
            self.frames_lost += lost
            self._next_frame_ns += round(lost * period)
        n = int((now_ns - self._next_frame_ns) // period) + 1
        t_ns = self._next_frame_ns + np.rint(np.arange(n) * period).astype(np.int64)
        self._next_frame_ns += round(n * period)
        data = self.frames(t_ns)
        self.frames_sent += n
        with self._fault_lock:
            garbage, self._corrupt_pending = self._corrupt_pending, 0
            drop = min(self._drop_pending, len(data))
            self._drop_pending -= drop
        if garbage:
            self.send(self._rng.integers(0, 256, garbage, dtype=np.uint8).tobytes())
            self.garbage_inserted += garbage
        self.bytes_dropped += drop
        self.send(data[drop:])


def _demo_power_w(t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """200 W idle with 250 W bursts at 1 Hz, so a live plot shows something."""
    return np.where((t_ns // 500_000_000) % 2 == 0, 200.0, 450.0)


def run_emulator_cli(power_w: PowerFn | None = None, firmware: int = 6, seed: int = 0) -> int:
    """Run an emulator until Ctrl-C, printing the port a driver should open."""
    return serve_until_interrupted(
        PmdEmulator(power_w or _demo_power_w, firmware=firmware, seed=seed))


def main(argv: Sequence[str] | None = None) -> int:
    """``wattlab emulate pmd``: a PMD-USB on a pty until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="wattlab emulate pmd")
    parser.add_argument("--firmware", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run_emulator_cli(firmware=args.firmware, seed=args.seed)
