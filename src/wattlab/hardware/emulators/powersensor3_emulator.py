"""A PowerSensor3 on a pseudo-terminal: the exact bytes of PROTOCOLS.md §1.

Written from the protocol description only (it shares no code with the driver), so the
integration tests cross-check two independent readings of the same document. Readings
come from a power waveform ``power_w(t_ns)`` split over the rails of a PCIe riser and two
12 V cables, quantised to 10-bit levels with the stored vref / sensitivity.
"""

from __future__ import annotations

import argparse
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.hardware.emulators.pty_device import PtyDevice, serve_until_interrupted

N_SENSORS = 8
RECORD_FORMAT = "<16s16sff?"
RECORD_BYTES = struct.calcsize(RECORD_FORMAT)  # 41
STOP_TERMINATOR = b"\xff\x3f\xff\x3f"
FULL_SCALE_V = 3.3
MAX_LEVEL = 1023
SLOT_12V_MAX_W = 66.0
SLOT_3V3_MAX_W = 9.9
MAX_BACKLOG_FRAMES_NS = 50_000_000  # frames older than this after a stall are lost

PowerFn = Callable[[Any], Any]


@dataclass(frozen=True)
class EmulatedSensor:
    """One configuration record as the device stores it."""

    type: str
    pair_name: str
    vref_v: float
    sensitivity: float
    in_use: bool

    def pack(self) -> bytes:
        return struct.pack(RECORD_FORMAT, self.type.encode()[:16], self.pair_name.encode()[:16],
                           self.vref_v, self.sensitivity, self.in_use)

    @staticmethod
    def unpack(record: bytes) -> EmulatedSensor:
        t, name, vref, sens, in_use = struct.unpack(RECORD_FORMAT, record)
        return EmulatedSensor(t.rstrip(b"\0").decode("ascii", "replace"),
                              name.rstrip(b"\0").decode("ascii", "replace"),
                              float(vref), float(sens), bool(in_use))


def default_config() -> list[EmulatedSensor]:
    """Pair 0 PCIe slot 12 V, pair 1 slot 3.3 V, pairs 2-3 external 12 V cables."""
    pairs = [("MLX10", 0.120, "PCIe slot 12V"), ("MLX10", 0.120, "PCIe slot 3.3V"),
             ("MLX50", 0.025, "ext 12V cable 1"), ("MLX50", 0.025, "ext 12V cable 2")]
    out: list[EmulatedSensor] = []
    for kind, sens, name in pairs:
        out.append(EmulatedSensor(kind, name, 1.65, sens, True))
        out.append(EmulatedSensor("voltage", name, 0.0, 0.091, True))
    return out


NOMINAL_RAIL_V = (12.0, 3.3, 12.0, 12.0)


def split_power_w(total_w: npt.NDArray[np.float64], active_pairs: Sequence[int]
                  ) -> dict[int, npt.NDArray[np.float64]]:
    """Share board power over the rails as a GPU does: a little on 3.3 V, slot 12 V capped."""
    shares: dict[int, npt.NDArray[np.float64]] = {}
    rest = total_w.copy()
    if 1 in active_pairs and len(active_pairs) > 1:
        shares[1] = np.clip(0.02 * rest, 0.0, SLOT_3V3_MAX_W)
        rest = rest - shares[1]
    others = [p for p in active_pairs if p not in (0, 1)]
    if 0 in active_pairs:
        shares[0] = np.minimum(0.4 * rest, SLOT_12V_MAX_W) if others else rest.copy()
        rest = rest - shares[0]
    for p in others:
        shares[p] = rest / len(others)
    if not others and 0 not in active_pairs and 1 in active_pairs:
        shares[1] = shares.get(1, np.zeros_like(rest)) + rest
    return shares


class PowerSensor3Emulator(PtyDevice):
    """The device: command parser, configuration store, 20 kHz frame stream, faults."""

    def __init__(
        self,
        power_w: PowerFn,
        *,
        rate_hz: float = 20000.0,
        config: Sequence[EmulatedSensor] | None = None,
        firmware: str = "F411-1.6.1",
        seed: int = 0,
        voltage_noise_v: float = 0.0,
        config_timeout_s: float = 2.0,
        max_backlog_ns: int = MAX_BACKLOG_FRAMES_NS,
    ) -> None:
        super().__init__("powersensor3")
        self.power_fn = power_w
        self.rate_hz = rate_hz
        self.period_ns = round(1e9 / rate_hz)
        self.config = list(config) if config is not None else default_config()
        self.firmware = firmware
        self.voltage_noise_v = voltage_noise_v
        self.config_timeout_s = config_timeout_s
        self.max_backlog_ns = max_backlog_ns  # the device's buffer: older frames are lost
        self._rng = np.random.default_rng(seed)
        self.clock_offset_us = int(self._rng.integers(0, 1 << 30))
        self._vectorised: bool | None = None
        self._state = "idle"
        self._state_since_s = 0.0
        self._index = 0
        self._rx = bytearray()
        self._streaming = False
        self._next_frame_ns = 0
        self.stream_started_ns = 0  # host time of the first frame after the last 'S'
        self.conversions = 0
        self.frames_sent = 0
        self.frames_lost = 0
        self.losses: list[tuple[int, int]] = []  # (due time of the first lost frame, frames)
        self.resets = 0
        self._marker_pending = False
        self._corrupt_pending = 0
        self._drop_pending = 0
        self._skip_frames_pending = 0
        self.garbage_inserted = 0
        self.bytes_dropped = 0
        self._fault_lock = threading.Lock()

    # -- faults (any thread) ----------------------------------------------------------------
    def inject_corrupt_bytes(self, n: int) -> None:
        """Insert ``n`` garbage bytes between two frames; none can start a frame (< 0xF0)."""
        with self._fault_lock:
            self._corrupt_pending += n

    def inject_drop_bytes(self, n: int) -> None:
        """Lose the first ``n`` bytes of the next streamed frame(s)."""
        with self._fault_lock:
            self._drop_pending += n

    def inject_lost_frames(self, n: int) -> None:
        """Take the next ``n`` frames but never send them (a USB buffer that overflowed).

        Only the device clock's jump shows the hole, its size modulo the 1024 µs wrap.
        """
        with self._fault_lock:
            self._skip_frames_pending += n

    def stall(self, seconds: float) -> None:
        """Hang for ``seconds``; frames due meanwhile beyond a short backlog are lost."""
        super().stall(seconds)

    # -- device clock and readings ------------------------------------------------------------
    def device_us(self, t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The firmware's micros() for host times ``t_ns`` (a free-running µs counter)."""
        return t_ns // 1000 + self.clock_offset_us

    def _power(self, t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        if self._vectorised is None:
            try:
                out = np.asarray(self.power_fn(t_ns), dtype=np.float64)
                self._vectorised = out.shape == t_ns.shape
                if self._vectorised:
                    return out
            except (TypeError, ValueError):
                self._vectorised = False
        if self._vectorised:
            return np.asarray(self.power_fn(t_ns), dtype=np.float64)
        return np.array([float(self.power_fn(int(t))) for t in t_ns], dtype=np.float64)

    def levels(self, t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """10-bit levels (n × 8) for frames at ``t_ns``: the scaling formula run backwards."""
        n = t_ns.shape[0]
        values = np.zeros((n, N_SENSORS))
        active = [p for p in range(N_SENSORS // 2)
                  if self.config[2 * p].in_use and self.config[2 * p + 1].in_use]
        shares = split_power_w(self._power(t_ns), active)
        for p in active:
            volts = np.full(n, NOMINAL_RAIL_V[p] if p < len(NOMINAL_RAIL_V) else 12.0)
            if self.voltage_noise_v > 0:
                volts = volts + self._rng.normal(0.0, self.voltage_noise_v, n)
            values[:, 2 * p] = shares[p] / volts
            values[:, 2 * p + 1] = volts
        vref = np.array([s.vref_v for s in self.config])
        sens = np.array([s.sensitivity for s in self.config])
        lv = np.rint((values * sens + vref) * MAX_LEVEL / FULL_SCALE_V)
        return np.clip(lv, 0, MAX_LEVEL).astype(np.int64)

    def encode_frames(self, t_ns: npt.NDArray[np.int64], marker_first: bool) -> bytes:
        """18 bytes per frame: timestamp word then sensors 0-7 (PROTOCOLS.md §1)."""
        n = t_ns.shape[0]
        t = self.device_us(t_ns) & 0x3FF
        lv = self.levels(t_ns)
        out = np.empty((n, 18), dtype=np.uint8)
        out[:, 0] = 0xF0 | ((t >> 6) & 0x0F)
        out[:, 1] = 0x40 | (t & 0x3F)
        ids = np.arange(N_SENSORS)
        out[:, 2::2] = 0x80 | (ids << 4) | ((lv >> 6) & 0x0F)
        out[:, 3::2] = lv & 0x3F
        if marker_first and n:
            out[0, 3] |= 0x40
        return out.tobytes()

    # -- command handling (device thread) -------------------------------------------------
    def on_start(self, now_ns: int) -> None:
        self._next_frame_ns = now_ns

    def on_bytes(self, data: bytes) -> None:
        for b in data:
            self._on_byte(b)

    def _enter(self, state: str) -> None:
        self._state = state
        self._state_since_s = time.monotonic()
        self._index = 0
        self._rx.clear()

    def _on_byte(self, b: int) -> None:
        if self._state == "read_config":
            self._state_since_s = time.monotonic()
            self._index += 1  # any byte acks the record just sent
            if self._index < N_SENSORS:
                self.send(self.config[self._index].pack())
            else:
                self.send(b"D")
                self._enter("idle")
            return
        if self._state == "write_config":
            self._state_since_s = time.monotonic()
            self._rx.append(b)
            if len(self._rx) == RECORD_BYTES:
                self.config[self._index] = EmulatedSensor.unpack(bytes(self._rx))
                self._rx.clear()
                self._index += 1
                self.send(b"S")
                if self._index == N_SENSORS:
                    self.send(b"D")
                    self._enter("idle")
            return
        self._command(bytes([b]))

    def _command(self, c: bytes) -> None:
        now_ns = time.monotonic_ns()
        if c == b"S":
            self._flush_due(now_ns)
            self._streaming = True
            self.conversions = 0
            self._next_frame_ns = now_ns
            self.stream_started_ns = now_ns
        elif c == b"T":
            self._flush_due(now_ns)
            self._streaming = False
        elif c == b"X":
            self._flush_due(now_ns)
            self._streaming = False
            if self._marker_pending:
                self._marker_pending = False
                self.send(self.encode_frames(np.array([now_ns], dtype=np.int64), True))
            self.send(STOP_TERMINATOR)
        elif c == b"M":
            self._marker_pending = True
        elif c == b"I":
            frame = self.encode_frames(np.array([now_ns], dtype=np.int64), self._marker_pending)
            self._marker_pending = False
            self.send(frame)
        elif c == b"Q":
            self._flush_due(now_ns)
            self.send(struct.pack("<I", self.conversions & 0xFFFFFFFF))
        elif c == b"V":
            self.send(self.firmware.encode("ascii") + b"\r\n")
        elif c == b"R":
            self._streaming = False
            self._enter("read_config")
            self.send(self.config[0].pack())
        elif c == b"W":
            self._streaming = False
            self._enter("write_config")
        elif c == b"Z":
            self._reset()
        # 'B' blinks a LED, 'Y' would jump to DFU; other bytes are ignored like the firmware.

    def _reset(self) -> None:
        self.resets += 1
        self._streaming = False
        self._marker_pending = False
        self._enter("idle")

    def tick(self, now_ns: int) -> None:
        if self._state != "idle" and time.monotonic() - self._state_since_s > self.config_timeout_s:
            self._reset()  # the host stalled a configuration exchange: the firmware resets
        self._flush_due(now_ns)

    def _lose_frames(self, lost: int) -> None:
        """The device takes ``lost`` frames that never reach the host; its clock runs on."""
        if lost <= 0:
            return
        self.frames_lost += int(lost)
        self.losses.append((self._next_frame_ns, int(lost)))
        self.conversions += int(lost)
        self._next_frame_ns += int(lost) * self.period_ns

    def _flush_due(self, now_ns: int) -> None:
        """Generate every frame due by ``now_ns`` as one vectorised block."""
        if not self._streaming or now_ns < self._next_frame_ns:
            return
        with self._fault_lock:
            skipped, self._skip_frames_pending = self._skip_frames_pending, 0
        if skipped:
            self._lose_frames(skipped)
        if now_ns - self._next_frame_ns > self.max_backlog_ns:
            self._lose_frames((now_ns - self.max_backlog_ns - self._next_frame_ns)
                              // self.period_ns)
        if now_ns < self._next_frame_ns:
            return
        n = (now_ns - self._next_frame_ns) // self.period_ns + 1
        t_ns = self._next_frame_ns + np.arange(n, dtype=np.int64) * self.period_ns
        self._next_frame_ns += int(n) * self.period_ns
        data = self.encode_frames(t_ns, self._marker_pending)
        self._marker_pending = False
        self.conversions += int(n)
        self.frames_sent += int(n)
        with self._fault_lock:
            corrupt, self._corrupt_pending = self._corrupt_pending, 0
            drop = min(self._drop_pending, len(data))
            self._drop_pending -= drop
        if corrupt:
            self.send(self._rng.integers(0, 0xF0, corrupt, dtype=np.uint8).tobytes())
            self.garbage_inserted += corrupt
        self.bytes_dropped += drop
        self.send(data[drop:])


def _demo_power_w(t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """150 W idle with 250 W bursts at 1 Hz, so a live plot shows something."""
    phase = (t_ns // 500_000_000) % 2
    return np.where(phase == 0, 150.0, 400.0)


def run_emulator_cli(power_w: PowerFn | None = None, rate_hz: float = 20000.0,
                     seed: int = 0) -> int:
    """Run an emulator until Ctrl-C, printing the port a driver should open."""
    return serve_until_interrupted(
        PowerSensor3Emulator(power_w or _demo_power_w, rate_hz=rate_hz, seed=seed))


def main(argv: Sequence[str] | None = None) -> int:
    """``wattlab emulate powersensor3``: a PowerSensor3 on a pty until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="wattlab emulate powersensor3")
    parser.add_argument("--rate-hz", type=float, default=20000.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run_emulator_cli(rate_hz=args.rate_hz, seed=args.seed)
