"""ElmorLabs PMD-USB over a byte transport: commands, config/CRC, continuous-mode decoder.

Wire format and numbers are from PROTOCOLS.md §3. Points no second source confirmed, and
where this driver is deliberately tolerant, all **[unverified]**:

* ``00`` answers 17 bytes; a trailing byte (some scripts read 18) is read if it arrives
  within the transport's timeout and dropped, and every query clears stale input first.
* Config layout with pack 2: ``u8 Version, pad, u16 Crc`` and a pad byte after
  ``OledDisable``; the CRC covers every byte from ``AdcOffset`` to the end (pad included).
  26 bytes for firmware < 6, 34 (with ``AdcGainOffset[8]``) from firmware 6 on.
* ``07`` and ``08`` get no reply; stopping sends ``07 00 00 00``.
* Continuous frames carry the enabled channels in ascending mask-bit order. A frame's
  rate is not documented: the decoder learns the period from the timestamps.
* The low 4 bits of every u16 word may always be 0 (a 12-bit ADC shifted left); the decoder
  only uses that as a check once the first 32 frames it accepted all had it.
* With ``ts_bytes`` 0 or 1 there is no usable device clock (one byte wraps every 85 µs):
  alignment then rests on value plausibility alone and times are host estimates.
* Frame timing: to lock on (at start and after a loss) the decoder wants 4 frames under
  10 ms apart with steps within ±50 % of each other; a device with much more irregular
  frame timing would need that loosened. Frames are held back one frame (``flush``).
* A loss of exactly a multiple of the frame length inside one frame keeps the stream in
  phase and cannot be detected: that frame mixes bytes of two true frames, each in place.
"""

from __future__ import annotations

import bisect
import enum
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.drivers.transport import ByteTransport
from wattlab.errors import MeterError, MeterProtocolError, MeterTimeoutError, UsageError
from wattlab.samples import Channel, SampleFlag


class Command(bytes, enum.Enum):
    """First byte host → device. ``RESET``/``BOOTLOADER`` are never sent by wattlab."""

    WELCOME = b"\x00"  # "ElmorLabs PMD-USB"
    PRODUCT = b"\x01"  # EE 0A <fw>
    SENSORS = b"\x02"  # 4 × {name[6], u16 V×100, u16 A×10, u16 W}
    READINGS = b"\x03"  # 4 × {i16 V×100, i16 A×10}
    CONFIG = b"\x04"  # config struct, CRC-16/CCITT-FALSE
    RAW_ADC = b"\x06"  # 16 bytes raw ADC
    CONTINUOUS = b"\x07"  # + enable, ts_bytes, mask
    BAUD = b"\x08"  # + u32 baud, parity, width, stop
    RESET = b"\xf0"
    BOOTLOADER = b"\xf1"
    NOP = b"\xff"


WELCOME = b"ElmorLabs PMD-USB"
VENDOR_ID = 0xEE
PRODUCT_ID = 0x0A
PRODUCT_BYTES = 3
SENSOR_FORMAT = "<6sHHH"
SENSORS_BYTES = 4 * struct.calcsize(SENSOR_FORMAT)  # 48
READINGS_FORMAT = "<8h"
READINGS_BYTES = struct.calcsize(READINGS_FORMAT)  # 16
CONFIG_FORMAT_V4 = "<BxH8bBxH7B3s"
CONFIG_FORMAT_V5 = "<BxH8bBxH7B8b3s"
CONFIG_CRC_FROM = 4  # offset of AdcOffset: the CRC covers from here to the end
BAUD_FORMAT = "<BIIII"
PARITY_NONE = 2
WIDTH_8BIT = 0
STOP_1BIT = 0
DEFAULT_BAUD = 115200
MIN_BAUD = 115200
MAX_BAUD = 2_000_000
BAUD_SETTLE_S = 1.0
TICK_HZ = 3_000_000
TS_BYTES_ALLOWED = (0, 1, 2, 4)
RAILS = ("pcie1", "pcie2", "eps1", "eps2")
VOLT_PER_LSB = 0.007568
AMP_PER_LSB = 0.0488
N_CHANNELS = 8

CONFIG_BYTES_V4 = struct.calcsize(CONFIG_FORMAT_V4)  # 26
CONFIG_BYTES_V5 = struct.calcsize(CONFIG_FORMAT_V5)  # 34


def config_bytes_for(firmware: int) -> int:
    """Config struct size: 26 bytes before firmware 6, 34 (with gain offsets) from 6 on."""
    return CONFIG_BYTES_V4 if firmware < 6 else CONFIG_BYTES_V5


def crc16_ccitt_false(data: bytes) -> int:
    """CRC-16/CCITT-FALSE: poly 0x1021, init 0xFFFF, no reflection, xorout 0."""
    crc = 0xFFFF
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def channel_is_current(bit: int) -> bool:
    """Mask bits alternate V, I per rail: odd bits are currents."""
    return bit % 2 == 1


def mask_bits(mask: int) -> list[int]:
    return [b for b in range(N_CHANNELS) if (mask >> b) & 1]


def full_rails(mask: int) -> list[int]:
    """Rails (0..3) whose voltage and current are both enabled: only those give power."""
    return [r for r in range(4) if (mask >> (2 * r)) & 3 == 3]


# ---------------------------------------------------------------------------------------
# Polled replies
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProductInfo:
    """Reply to ``01``: vendor, product and firmware bytes."""

    vendor_id: int
    product_id: int
    firmware: int


@dataclass(frozen=True)
class SensorReading:
    """One rail of the ``02`` reply, as the device formats it for its display."""

    name: str
    voltage_v: float
    current_a: float
    power_w: float


@dataclass(frozen=True)
class RailReading:
    """One rail of the ``03`` reply."""

    voltage_v: float
    current_a: float

    @property
    def power_w(self) -> float:
        return self.voltage_v * self.current_a


@dataclass(frozen=True)
class PmdConfig:
    """The device's config struct (``04``); ``adc_gain_offset`` is empty before firmware 6."""

    version: int
    crc: int
    adc_offset: tuple[int, ...]
    oled_disable: int
    timeout_count: int
    timeout_action: int
    oled_speed: int
    restart_adc_flag: int
    cal_flag: int
    update_config_flag: int
    oled_rotation: int
    averaging: int
    adc_gain_offset: tuple[int, ...] = ()
    rsvd: bytes = b"\0\0\0"

    @staticmethod
    def unpack(raw: bytes, port: str = "pmd") -> PmdConfig:
        """Parse and CRC-check a 26- or 34-byte struct."""
        if len(raw) == CONFIG_BYTES_V4:
            f = struct.unpack(CONFIG_FORMAT_V4, raw)
            gain: tuple[int, ...] = ()
            rsvd = f[19]
        elif len(raw) == CONFIG_BYTES_V5:
            f = struct.unpack(CONFIG_FORMAT_V5, raw)
            gain = tuple(int(x) for x in f[19:27])
            rsvd = f[27]
        else:
            raise MeterProtocolError(f"{port}: config struct of {len(raw)} bytes, expected "
                                     f"{CONFIG_BYTES_V4} or {CONFIG_BYTES_V5}")
        computed = crc16_ccitt_false(raw[CONFIG_CRC_FROM:])
        if computed != f[1]:
            raise MeterProtocolError(
                f"{port}: config CRC mismatch: device says 0x{f[1]:04X}, "
                f"bytes {CONFIG_CRC_FROM}..{len(raw) - 1} give 0x{computed:04X}"
            )
        (oled_disable, timeout_count, timeout_action, oled_speed, restart_adc, cal,
         update_config, rotation, averaging) = (int(x) for x in f[10:19])
        return PmdConfig(int(f[0]), int(f[1]), tuple(int(x) for x in f[2:10]), oled_disable,
                         timeout_count, timeout_action, oled_speed, restart_adc, cal,
                         update_config, rotation, averaging, gain, bytes(rsvd))

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version, "crc": self.crc, "adc_offset": list(self.adc_offset),
            "oled_disable": self.oled_disable, "timeout_count": self.timeout_count,
            "timeout_action": self.timeout_action, "oled_speed": self.oled_speed,
            "restart_adc_flag": self.restart_adc_flag, "cal_flag": self.cal_flag,
            "update_config_flag": self.update_config_flag,
            "oled_rotation": self.oled_rotation, "averaging": self.averaging,
            "adc_gain_offset": list(self.adc_gain_offset),
        }


# ---------------------------------------------------------------------------------------
# Continuous-mode decoder
# ---------------------------------------------------------------------------------------
MAX_STEP_TICKS = TICK_HZ  # no frame comes a second after the previous one
MAX_PERIOD_TICKS = 30_000  # a clean run to lock onto has frames < 10 ms apart [unverified]
V_MIN_RAW = -66  # -0.5 V: a rail is never below that
I_MIN_RAW = -102  # -5 A: nor does current flow back that much
CONFIRM_FRAMES = 4
NIBBLE_LEARN_FRAMES = 32
# One poll decodes at most this much: at the 2 MB/s the decoder holds on any bytes (10x
# the 200 kB/s of 2 Mbaud 8N1; bench/decode.py) that is under 33 ms, within a poll's
# ~0.1 s, and still 0.33 s of stream at 2 Mbaud, so a backlog drains (1 MB took 28-39 s)
READ_MAX_BYTES = 1 << 16
SHORT_RUN_FRAMES = 16  # a run is checked frame by frame this far, then in numpy slices


@dataclass
class DecodedFrames:
    """Frames from one ``feed``: wrapped timestamps, unwrapped ticks, raw words, SI values.

    ``skip_events`` = (index of the first frame after the skip, bytes skipped); a skip that
    spans feeds is reported once, with its whole count, when the stream is found again.
    ``ticks`` is None when the frames carry no usable device clock.
    """

    ts_raw: npt.NDArray[np.int64]
    ticks: npt.NDArray[np.int64] | None
    words: npt.NDArray[np.uint16]
    values: npt.NDArray[np.float64]
    resync: npt.NDArray[np.bool_]
    skipped_bytes: int = 0
    skip_events: list[tuple[int, int]] = field(default_factory=list)

    @property
    def n(self) -> int:
        return int(self.words.shape[0])


class FrameOffsets:
    """Every byte offset of one read taken as a frame start: what the checks need, at once.

    Why: the decoder asks, after each loss, where the next run of consistent frames starts
    and how long it runs. Computing that per question, over the rest of the read, made it
    quadratic on garbage (12-48 kB/s on periodic bytes, issue 36); here each offset's
    plausibility, timestamp and step to the frame after it are computed once per read, the
    offsets that confirm a lock (CONFIRM_FRAMES consistent frames, the learnt period aside)
    listed in order, and the decoder walks them.
    """

    def __init__(self, dec: ContinuousDecoder, buf: npt.NDArray[np.uint8]) -> None:
        self.dec = dec
        f, t, n = dec.frame_bytes, dec.ts_bytes, buf.shape[0]
        m = max(0, n - f + 1)  # offsets where a whole frame fits
        self.values_ok = np.ones(m, dtype=bool)
        self.nibble_zero = np.ones(m, dtype=bool)
        for c in range(len(dec.bits)):
            low, high = buf[t + 2 * c:t + 2 * c + m], buf[t + 2 * c + 1:t + 2 * c + 1 + m]
            word = low.astype(np.uint16) | (high.astype(np.uint16) << 8)
            raw12 = word.view(np.int16) >> 4  # the 12-bit value, sign extended
            self.values_ok &= raw12 >= int(dec._min_raw[c] - dec._offset[c])
            self.nibble_zero &= (low & 0xF) == 0
        self.ts = np.zeros(m, dtype=np.int64)
        for j in range(t if dec.has_clock else 0):
            self.ts |= buf[j:j + m].astype(np.int64) << (8 * j)
        self.step = (self.ts[f:] - self.ts[:max(0, m - f)]) % dec.wrap  # to the next frame
        self.ts_at = self.ts.data  # scalar reads without numpy's per-item cost
        self.step_at = self.step.data
        self.use_rule(bool(dec.nibble_rule))

    def use_rule(self, nibble_rule: bool) -> None:
        """Plausible frames, and the lock candidates, under the nibble rule now in force."""
        dec, f = self.dec, self.dec.frame_bytes
        self.ok = self.values_ok & self.nibble_zero if nibble_rule else self.values_ok
        self.ok_bytes = self.ok.tobytes()
        last = self.ok.shape[0] - (CONFIRM_FRAMES - 1) * f  # offsets with 4 frames after
        if last <= 0:
            self.starts: list[int] = []
            self.medians: list[float] = []
            return
        lock = self.ok[:last].copy()
        for i in range(1, CONFIRM_FRAMES):
            lock &= self.ok[i * f:i * f + last]
        if not dec.has_clock:
            self.starts, self.medians = np.flatnonzero(lock).tolist(), []
            return
        s = np.stack([self.step[i * f:i * f + last] for i in range(CONFIRM_FRAMES - 1)])
        lo, hi = s.min(axis=0), s.max(axis=0)
        med = np.median(s, axis=0)
        lock &= (lo > 0) & (hi <= min(dec.wrap // 2, MAX_PERIOD_TICKS))
        lock &= (hi <= 1.5 * med) & (lo >= 0.5 * med)  # a clean, even run
        idx = np.flatnonzero(lock)
        self.starts, self.medians = idx.tolist(), med[idx].tolist()


def counted_median(counts: Counter[int]) -> float:
    """The median of values given as value → count (as ``np.median`` of them expanded)."""
    values = sorted(counts)
    cum = np.cumsum([counts[v] for v in values])
    total = int(cum[-1])
    lo = values[int(np.searchsorted(cum, (total - 1) // 2, side="right"))]
    hi = values[int(np.searchsorted(cum, total // 2, side="right"))]
    return (lo + hi) / 2


class ContinuousDecoder:
    """Headerless frames → arrays, vectorised; finds the frame boundary again after loss.

    Each read is looked at once, every byte offset as a frame start (``FrameOffsets``). A
    run of frames is accepted while each frame is plausible (no voltage below -0.5 V, no
    current below -5 A, learnt zero low nibbles) and each timestamp step is positive and
    under 8 periods. At the first bad frame it looks up the next offset where
    ``CONFIRM_FRAMES`` consecutive
    frames are plausible and evenly spaced in time (every step under 10 ms and within
    ±50 % of their median, the median within 2× the learnt period); bytes before it are
    skipped and counted. The last accepted frame is held back until its successor is seen:
    when bytes had to be skipped after it, bytes may have gone missing from its tail
    (nothing in a frame can tell), so it is dropped and counted as skipped too. A clean
    jump of the timestamp with no byte skipped (whole frames lost) keeps it.
    Invariant, for tests: ``frame_bytes · frames + skipped + pending_bytes`` = bytes fed.
    """

    def __init__(self, mask: int, ts_bytes: int, adc_offset: Sequence[int] = (0,) * 8,
                 low_nibble_zero: bool | None = None) -> None:
        if not 0 < mask <= 0xFF:
            raise UsageError(f"PMD channel mask 0x{mask:X} must enable 1-8 channels")
        if ts_bytes not in TS_BYTES_ALLOWED:
            raise UsageError(f"PMD timestamp bytes {ts_bytes} not one of {TS_BYTES_ALLOWED}")
        if len(adc_offset) != N_CHANNELS:
            raise UsageError(f"PMD AdcOffset needs 8 values, got {len(adc_offset)}")
        self.mask = mask
        self.ts_bytes = ts_bytes
        self.bits = mask_bits(mask)
        self.frame_bytes = ts_bytes + 2 * len(self.bits)
        self.has_clock = ts_bytes >= 2
        self.wrap = 1 << (8 * ts_bytes)
        self._offset = np.array([adc_offset[b] for b in self.bits], dtype=np.int64)
        cur = np.array([channel_is_current(b) for b in self.bits])
        self._min_raw = np.where(cur, I_MIN_RAW, V_MIN_RAW)
        self._scale = np.where(cur, AMP_PER_LSB, VOLT_PER_LSB)
        self.nibble_rule = low_nibble_zero
        self._nibble_fixed = low_nibble_zero is not None
        self.reset()

    def reset(self) -> None:
        """A new stream: forget alignment, clock and learnt period (not the nibble rule)."""
        self._carry = b""
        # accepted, successor not yet seen: its bytes, or during a feed its offset in the read
        self._held: npt.NDArray[np.uint8] | int | None = None
        self._held_ts = 0  # its timestamp
        self._prev_ts: int | None = None  # last emitted frame's timestamp
        self._ticks = 0
        self._anchor = True  # the next frame must be confirmed by a candidate search
        self._skip_pending = 0  # bytes skipped since the held frame
        self._event_pending = 0  # skipped bytes to report on the next emitted frame
        self.period_ticks: float | None = None
        # the run being accepted, across reads: its step counts and frames, and the step
        # cap fixed when it started, so that where reads end changes nothing (issue 34 CI)
        self._run_steps: Counter[int] = Counter()
        self._run_frames = 0
        self._run_cap = 0
        self._nibble_seen = 0

    @property
    def pending_bytes(self) -> int:
        held = 0 if self._held is None else self.frame_bytes
        return len(self._carry) + held

    # -- field extraction -------------------------------------------------------------------
    def _fields(self, rows: npt.NDArray[np.uint8]) -> tuple[
            npt.NDArray[np.int64], npt.NDArray[np.uint16]]:
        r = rows.astype(np.int64)
        ts = np.zeros(rows.shape[:-1], dtype=np.int64)
        for j in range(self.ts_bytes):
            ts |= r[..., j] << (8 * j)
        t = self.ts_bytes
        words = (r[..., t::2] | (r[..., t + 1::2] << 8)).astype(np.uint16)
        return ts, words

    def _raw12(self, words: npt.NDArray[np.uint16]) -> npt.NDArray[np.int64]:
        r12 = (words.astype(np.int64) >> 4) & 0xFFF
        return np.where(r12 >= 2048, r12 - 4096, r12) + self._offset

    def _max_step(self) -> int:
        cap = min(self.wrap // 2, MAX_STEP_TICKS)
        if self.period_ticks is not None:
            cap = min(cap, int(8 * self.period_ticks) + 1)
        return cap

    # -- acceptance -------------------------------------------------------------------------
    def _find(self, o: FrameOffsets, p: int) -> int | None:
        """First offset ≥ p starting CONFIRM_FRAMES consistent frames; None if none yet.

        A first confirmation also sets the period the following run is checked against.
        """
        i = bisect.bisect_left(o.starts, p)
        if self.has_clock and self.period_ticks is not None:
            lo, hi = self.period_ticks / 2, 2 * self.period_ticks
            while i < len(o.starts) and not lo <= o.medians[i] <= hi:
                i += 1
        if i == len(o.starts):
            return None
        if self.has_clock and self.period_ticks is None:
            # the confirmed frames' spacing bounds the run that follows them: with
            # only the loose cap, a frame spliced by a cut and the garbage after it
            # were taken as one more step (found by the property test)
            self.period_ticks = o.medians[i]
        return o.starts[i]

    def _run_length(self, o: FrameOffsets, p: int, k: int) -> int:
        """How many of the k frames from p continue the held frame (or the confirmed start).

        The first few are checked one by one (a run in garbage is short), then in growing
        numpy slices (a clean stream's run is the whole read).
        """
        f, ok = self.frame_bytes, o.ok_bytes
        max_step = self._run_cap
        if not ok[p]:
            return 0
        if (self.has_clock and not self._anchor and self._held is not None
                and not 0 < (o.ts_at[p] - self._held_ts) % self.wrap <= max_step):
            return 0
        j, short, clock, step_at = 1, min(k, SHORT_RUN_FRAMES), self.has_clock, o.step_at
        while j < short:
            q = p + f * j
            if not ok[q] or (clock and not 0 < step_at[q - f] <= max_step):
                return j
            j += 1
        chunk = SHORT_RUN_FRAMES
        while j < k:
            hi = min(k, j + chunk)
            good = o.ok[p + f * j:p + f * hi:f]
            if self.has_clock:
                steps = o.step[p + f * (j - 1):p + f * (hi - 1):f]
                good = good & (steps > 0) & (steps <= max_step)
            if not good.all():
                return j + int(np.argmin(good))
            j, chunk = hi, 4 * chunk
        return j

    def _start_run(self) -> None:
        self._run_steps.clear()
        self._run_frames = 0
        self._run_cap = self._max_step() if self.has_clock else 0

    def _learn(self, o: FrameOffsets, p: int, j: int) -> None:
        """The period is the median step of the whole run so far, however it was read."""
        f = self.frame_bytes
        if self.has_clock:
            if self._run_frames:
                self._run_steps[(o.ts_at[p] - self._held_ts) % self.wrap] += 1
            steps, counts = np.unique(o.step[p:p + f * (j - 1):f], return_counts=True)
            self._run_steps.update(dict(zip(steps.tolist(), counts.tolist(), strict=True)))
        self._run_frames += j
        if self.has_clock and (self._run_frames > CONFIRM_FRAMES
                               or (self.period_ticks is None and self._run_frames > 1)):
            self.period_ticks = counted_median(self._run_steps)
        if not self._nibble_fixed and self.nibble_rule is None:
            if not o.nibble_zero[p:p + f * j:f].all():
                self.nibble_rule = False
            else:
                self._nibble_seen += j
                if self._nibble_seen >= NIBBLE_LEARN_FRAMES:
                    self.nibble_rule = True
                    o.use_rule(True)

    def feed(self, data: bytes) -> DecodedFrames:
        """Decode ``data`` plus what was kept from the last call."""
        buf = np.frombuffer(self._carry + data, dtype=np.uint8)
        self._carry = b""
        n, f = buf.shape[0], self.frame_bytes
        o = FrameOffsets(self, buf)
        p = 0
        emitted: list[tuple[npt.NDArray[np.uint8] | int, int]] = []
        self._n_out = 0
        self._skipped = 0
        self._events: list[tuple[int, int]] = []
        self._resync_at: list[int] = []
        prev_before = self._prev_ts
        while True:
            if self._anchor:
                q = self._find(o, p)
                if q is None:
                    lim = max(p, n - CONFIRM_FRAMES * f + 1)
                    self._skip(lim - p)
                    p = lim
                    break
                self._skip(q - p)
                p = q
                self._resolve_held(emitted)
                self._start_run()
            k = (n - p) // f
            if k == 0:
                break
            j = self._run_length(o, p, k)
            if j:
                self._learn(o, p, j)
                if self._held is not None:
                    self._emit(emitted, self._held)
                if j > 1:
                    self._emit(emitted, p, j - 1)
                self._held = last = p + f * (j - 1)
                self._held_ts = o.ts_at[last] if self.has_clock else 0
                self._anchor = False
                p += f * j
            elif self._anchor:  # cannot happen after a search; never spin
                self._skip(1)
                p += 1
            if j < k:
                self._anchor = True
        self._carry = buf[p:].tobytes()
        if isinstance(self._held, int):
            self._held = buf[self._held:self._held + f].copy()
        out = self._decode(emitted, prev_before, buf)
        out.skipped_bytes = self._skipped
        out.skip_events = self._events
        return out

    def flush(self) -> DecodedFrames:
        """End of stream: emit the held-back frame, unless what followed it broke the phase.

        Bytes left over that make no whole frame count as a broken phase: a cut inside the
        held frame can splice the next frame's bytes into its tail, leaving such a remainder,
        and nothing after it can confirm the frame (found by the property test below it).
        """
        prev_before = self._prev_ts
        emitted: list[tuple[npt.NDArray[np.uint8] | int, int]] = []
        self._n_out = 0
        self._skipped = 0
        self._events, self._resync_at = [], []
        if self._held is not None:
            if self._anchor or self._carry:  # its successor was bad or cut short: suspect
                self._skip(self.frame_bytes)
            else:
                self._emit(emitted, self._held)
            self._held = None
        self._anchor = True
        out = self._decode(emitted, prev_before, np.zeros(0, dtype=np.uint8))
        out.skipped_bytes = self._skipped
        out.skip_events = self._events
        return out

    def _skip(self, nbytes: int) -> None:
        self._skipped += nbytes
        self._skip_pending += nbytes

    def _resolve_held(self, emitted: list[tuple[npt.NDArray[np.uint8] | int, int]]) -> None:
        """After a search: keep the held frame only if no byte had to be skipped after it."""
        if self._held is not None:
            if self._skip_pending == 0:
                self._emit(emitted, self._held)
            else:
                self._skip(self.frame_bytes)
            self._held = None
        self._event_pending += self._skip_pending
        self._skip_pending = 0

    def _emit(self, emitted: list[tuple[npt.NDArray[np.uint8] | int, int]],
              start: npt.NDArray[np.uint8] | int, count: int = 1) -> None:
        """Pass on ``count`` frames from offset ``start`` of the read (or one kept row)."""
        if self._event_pending:
            self._events.append((self._n_out, self._event_pending))
            self._resync_at.append(self._n_out)
            self._event_pending = 0
        emitted.append((start, count))
        self._n_out += count

    def _rows(self, emitted: list[tuple[npt.NDArray[np.uint8] | int, int]],
              buf: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        """The emitted frames' bytes, gathered at once (a row kept from the last read first)."""
        f = self.frame_bytes
        kept = [row[None, :] for row, _ in emitted if not isinstance(row, int)]
        runs = np.array([(s, c) for s, c in emitted if isinstance(s, int)],
                        dtype=np.int64).reshape(-1, 2)
        counts = runs[:, 1]
        total = int(counts.sum())
        first = np.repeat(runs[:, 0] - f * (np.cumsum(counts) - counts), counts)
        offsets = first + f * np.arange(total, dtype=np.int64)
        return np.concatenate([*kept, buf[offsets[:, None] + np.arange(f)]])

    def _decode(self, emitted: list[tuple[npt.NDArray[np.uint8] | int, int]],
                prev_ts: int | None, buf: npt.NDArray[np.uint8]) -> DecodedFrames:
        n, nch = self._n_out, len(self.bits)
        rows = self._rows(emitted, buf)
        ts, words = self._fields(rows)
        values = (self._raw12(words) * self._scale).astype(np.float64)
        ticks: npt.NDArray[np.int64] | None = None
        if self.has_clock:
            first = int(ts[0]) if n and prev_ts is None else (prev_ts or 0)
            steps = np.diff(ts, prepend=first) % self.wrap
            start = first if prev_ts is None else self._ticks
            ticks = (start + np.cumsum(steps)).astype(np.int64)
            if n:
                self._ticks = int(ticks[-1])
                self._prev_ts = int(ts[-1])
        elif n:
            self._prev_ts = 0
        resync = np.zeros(n, dtype=bool)
        resync[self._resync_at] = True
        return DecodedFrames(ts, ticks, words.reshape(n, nch), values.reshape(n, nch), resync)


# ---------------------------------------------------------------------------------------
# Device clock → host clock
# ---------------------------------------------------------------------------------------
class TickClock:
    """Maps unwrapped 3 MHz ticks onto the host's monotonic clock.

    The offset is the lower envelope of ``read time − device time of the newest frame`` (a
    frame is always read after it was made), allowed to creep up by ``drift_ppm``. A read
    more than ``slack_ns`` later than that predicts means the device clock jumped (reset,
    wrap lost): the offset is re-anchored and the frames are flagged ``ESTIMATED_TIME``.
    Without device ticks, frames are spread evenly since the previous read.
    """

    def __init__(self, slack_ns: int = 500_000_000, drift_ppm: float = 200.0) -> None:
        self.slack_ns = slack_ns
        self.drift_ppm = drift_ppm
        self.reset()

    def reset(self) -> None:
        self._offset_ns: int | None = None
        self._last_read_ns = 0
        self._last_out_ns = -(1 << 62)

    def to_host(self, ticks: npt.NDArray[np.int64] | None, n: int, host_read_ns: int
                ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        estimated = np.zeros(n, dtype=bool)
        if n == 0:
            return np.zeros(0, dtype=np.int64), estimated
        if ticks is None:
            start = self._last_read_ns if self._last_read_ns else host_read_ns
            t = start + ((host_read_ns - start) * np.arange(1, n + 1, dtype=np.int64)) // n
            estimated[:] = True
        else:
            dev_ns = (ticks * 1000) // 3
            candidate = host_read_ns - int(dev_ns[-1])
            if self._offset_ns is None:
                offset = candidate
            else:
                elapsed = max(0, host_read_ns - self._last_read_ns)
                allowed = self._offset_ns + int(elapsed * self.drift_ppm * 1e-6)
                offset = min(candidate, allowed)
                if abs(candidate - allowed) > self.slack_ns:  # the device clock jumped
                    offset = candidate
                    estimated[:] = True
            self._offset_ns = offset
            t = dev_ns + offset
        # Never step back behind what was already published.
        t = np.maximum(t, self._last_out_ns + 1 + np.arange(n, dtype=np.int64))
        self._last_out_ns = int(t[-1])
        self._last_read_ns = host_read_ns
        return t.astype(np.int64), estimated


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------
@dataclass
class StreamBlock:
    """Decoded, timed and scaled samples from one read of the continuous stream."""

    t_host_ns: npt.NDArray[np.int64]
    ticks: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    flags: npt.NDArray[np.uint8]
    skipped_bytes: int = 0
    skip_events: list[tuple[int, int]] = field(default_factory=list)

    @property
    def n(self) -> int:
        return int(self.t_host_ns.shape[0])


@dataclass(frozen=True)
class DeviceInfo:
    """What ``connect`` learnt."""

    welcome: str
    product: ProductInfo
    config: PmdConfig


def stream_channels(mask: int) -> list[Channel]:
    """Per rail with V and I enabled: voltage, current, power; then the total."""
    rails = full_rails(mask)
    if not rails:
        raise UsageError(f"PMD mask 0x{mask:02X} enables no rail's voltage and current")
    out: list[Channel] = []
    for r in rails:
        name = RAILS[r]
        out += [Channel(f"{name}_voltage_v", "V", f"{name.upper()} voltage"),
                Channel(f"{name}_current_a", "A", f"{name.upper()} current"),
                Channel(f"{name}_power_w", "W", f"{name.upper()} power, V·I")]
    out.append(Channel("power_total_w", "W", "sum of the power of every measured rail"))
    return out


def rail_values(values: npt.NDArray[np.float64], mask: int) -> npt.NDArray[np.float32]:
    """Decoder columns (enabled bits) → per-rail V, I, P and the total, as float32."""
    bits = mask_bits(mask)
    rails = full_rails(mask)
    n = values.shape[0]
    out = np.empty((n, 3 * len(rails) + 1), dtype=np.float64)
    total = np.zeros(n)
    for k, r in enumerate(rails):
        v = values[:, bits.index(2 * r)]
        i = values[:, bits.index(2 * r + 1)]
        out[:, 3 * k], out[:, 3 * k + 1], out[:, 3 * k + 2] = v, i, v * i
        total += v * i
    out[:, -1] = total
    return out.astype(np.float32)


class PmdUsb:
    """The PMD-USB's commands as methods; nothing is sent before a method is called."""

    def __init__(self, transport: ByteTransport, name: str | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.transport = transport
        self.port = name or str(getattr(transport, "port_name", "pmd-usb"))
        self.sleep = sleep
        self.clock_ns = clock_ns
        self.baud = DEFAULT_BAUD
        self.firmware: int | None = None
        self.config: PmdConfig | None = None
        self.decoder: ContinuousDecoder | None = None
        self.clock = TickClock()
        self.mask = 0xFF
        self.streaming = False

    # -- polled commands ---------------------------------------------------------------------
    def _query(self, cmd: Command, n: int) -> bytes:
        self.transport.reset_input()
        self.transport.write(cmd.value)
        try:
            return self.transport.read(n)
        except MeterTimeoutError as e:
            raise MeterTimeoutError(f"{self.port}: no {n}-byte reply to command "
                                    f"{cmd.value.hex()} ({cmd.name}): {e}") from e

    def identify(self) -> str:
        """``00`` → ``ElmorLabs PMD-USB``; one trailing byte is tolerated and dropped."""
        reply = self._query(Command.WELCOME, len(WELCOME))
        if reply != WELCOME:
            raise MeterProtocolError(f"{self.port}: not a PMD-USB: welcome is {reply!r}, "
                                     f"expected {WELCOME!r}")
        self.transport.read_available(1)  # waits at most the transport's (short) timeout
        return reply.decode("ascii")

    def read_product(self) -> ProductInfo:
        """``01`` → ``EE 0A <fw>``."""
        raw = self._query(Command.PRODUCT, PRODUCT_BYTES)
        if raw[0] != VENDOR_ID or raw[1] != PRODUCT_ID:
            raise MeterProtocolError(f"{self.port}: product reply {raw.hex(' ')}, expected "
                                     f"{VENDOR_ID:02x} {PRODUCT_ID:02x} <fw>")
        self.firmware = raw[2]
        return ProductInfo(raw[0], raw[1], raw[2])

    def read_sensors(self) -> list[SensorReading]:
        """``02``: the device's own rounded rail readings, with names."""
        raw = self._query(Command.SENSORS, SENSORS_BYTES)
        out = []
        for name, v, a, w in struct.iter_unpack(SENSOR_FORMAT, raw):
            out.append(SensorReading(name.split(b"\0", 1)[0].decode("ascii", "replace"),
                                     v / 100, a / 10, float(w)))
        return out

    def read_readings(self) -> list[RailReading]:
        """``03``: V and A of PCIE1, PCIE2, EPS1, EPS2."""
        raw = struct.unpack(READINGS_FORMAT, self._query(Command.READINGS, READINGS_BYTES))
        return [RailReading(raw[2 * r] / 100, raw[2 * r + 1] / 10) for r in range(4)]

    def read_config(self, firmware: int | None = None) -> PmdConfig:
        """``04``: size from the firmware (read with ``01`` first if not given), CRC checked."""
        fw = firmware if firmware is not None else self.firmware
        if fw is None:
            fw = self.read_product().firmware
        self.config = PmdConfig.unpack(self._query(Command.CONFIG, config_bytes_for(fw)),
                                       self.port)
        return self.config

    def connect(self) -> DeviceInfo:
        """Stop a stream an earlier host left running, then identify and read the config."""
        self.stop_continuous()
        self.sleep(0.05)
        try:
            welcome = self.identify()
        except MeterProtocolError:  # stream bytes still in flight: drain and ask again
            self.sleep(0.2)
            welcome = self.identify()
        product = self.read_product()
        config = self.read_config(product.firmware)
        return DeviceInfo(welcome, product, config)

    # -- settings ----------------------------------------------------------------------------
    def set_baudrate(self, baud: int, settle_s: float = BAUD_SETTLE_S) -> None:
        """``08``: switch the device to ``baud`` 8N1, wait, then switch the host port."""
        if not MIN_BAUD <= baud <= MAX_BAUD:
            raise UsageError(f"{self.port}: baud {baud} outside {MIN_BAUD}..{MAX_BAUD}")
        setter = getattr(self.transport, "set_baudrate", None)
        if setter is None:
            raise MeterError(f"{self.port}: transport cannot change its baud rate")
        self.transport.write(struct.pack(BAUD_FORMAT, Command.BAUD.value[0], baud,
                                         PARITY_NONE, WIDTH_8BIT, STOP_1BIT))
        self.sleep(settle_s)
        try:
            setter(baud)
        except (OSError, ValueError) as e:
            raise MeterError(f"{self.port}: cannot set host port to {baud} baud: {e}") from e
        self.transport.reset_input()
        self.baud = baud

    # -- continuous mode ---------------------------------------------------------------------
    def start_continuous(self, mask: int = 0xFF, ts_bytes: int = 4) -> None:
        """``07 01 <ts_bytes> <mask>``: the device streams headerless frames."""
        stream_channels(mask)  # validates that some rail gives power
        offsets = self.config.adc_offset if self.config is not None else (0,) * N_CHANNELS
        self.decoder = ContinuousDecoder(mask, ts_bytes, offsets)
        self.mask = mask
        self.clock.reset()
        self.transport.reset_input()
        self.transport.write(bytes([Command.CONTINUOUS.value[0], 1, ts_bytes, mask]))
        self.streaming = True

    def stop_continuous(self) -> None:
        """``07 00 00 00``: stop streaming (frames in flight still arrive)."""
        self.transport.write(bytes([Command.CONTINUOUS.value[0], 0, 0, 0]))
        self.streaming = False

    def read_stream(self, min_duration_s: float = 0.0, max_bytes: int = READ_MAX_BYTES
                    ) -> StreamBlock:
        """Read what has arrived (for at least ``min_duration_s``), decode, time and scale."""
        if self.decoder is None:
            raise MeterError(f"{self.port}: read_stream before start_continuous")
        deadline = time.monotonic() + min_duration_s
        data = bytearray()
        while True:
            data += self.transport.read_available(max_bytes - len(data))
            if time.monotonic() >= deadline or len(data) >= max_bytes:
                break
        return self.decode(bytes(data), self.clock_ns())

    def flush_stream(self) -> StreamBlock:
        """The frame the decoder holds back for its successor (after the stream stopped)."""
        return self.decode(b"", self.clock_ns(), end=True)

    def decode(self, data: bytes, host_read_ns: int, end: bool = False) -> StreamBlock:
        """Decode stream bytes read at ``host_read_ns`` into a block."""
        if self.decoder is None:
            raise MeterError(f"{self.port}: decode before start_continuous")
        frames = self.decoder.flush() if end else self.decoder.feed(data)
        t_host, estimated = self.clock.to_host(frames.ticks, frames.n, host_read_ns)
        ticks = frames.ticks if frames.ticks is not None else (t_host * 3) // 1000
        flags = np.zeros(frames.n, dtype=np.uint8)
        flags[frames.resync] |= np.uint8(SampleFlag.RESYNC)
        flags[estimated] |= np.uint8(SampleFlag.ESTIMATED_TIME)
        return StreamBlock(t_host, ticks.astype(np.int64), rail_values(frames.values, self.mask),
                           flags, frames.skipped_bytes, frames.skip_events)
