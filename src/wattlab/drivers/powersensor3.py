"""PowerSensor3 (ASTRON / NLeSC) over a byte transport: commands, frame decoder, clock, scaling.

Wire format and numbers are from PROTOCOLS.md §1. Points no second source confirmed and
where this driver is deliberately tolerant:

* ``X`` is assumed to answer ``FF 3F FF 3F`` even when the device was not streaming
  (``connect`` relies on it to clear a stream left running by an earlier host); a firmware
  sending a single ``FF 3F`` is accepted too.
* A marker bit on sensors 1-6 is ignored (the firmware sets it only on sensor 0); on
  sensor 7 it makes the word a timestamp word, so such a frame is rejected as misaligned.
"""

from __future__ import annotations

import contextlib
import enum
import math
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from wattlab.drivers.transport import ByteTransport
from wattlab.errors import MeterError, MeterProtocolError, MeterTimeoutError
from wattlab.samples import Channel, SampleFlag


class Command(bytes, enum.Enum):
    """One ASCII byte host → device. ``RESET`` and ``BOOTLOADER`` are never sent by wattlab."""

    START = b"S"  # start streaming, resets the conversion counter
    STOP = b"T"  # stop streaming, no reply
    STOP_FLUSH = b"X"  # stop, flush pending markers, reply FF 3F FF 3F
    MARKER = b"M"  # marker bit on the next frame
    SINGLE_FRAME = b"I"  # reply one 18-byte frame
    COUNTER = b"Q"  # reply uint32 LE conversion counter
    VERSION = b"V"  # reply firmware version line
    BLINK = b"B"
    READ_CONFIG = b"R"  # 8 × (41-byte record, host ack), then D
    WRITE_CONFIG = b"W"  # 8 × (host 41-byte record, device S), then D
    RESET = b"Z"
    BOOTLOADER = b"Y"


N_SENSORS = 8
N_PAIRS = N_SENSORS // 2
FRAME_BYTES = 18
CONFIG_RECORD_FORMAT = "<16s16sff?"
CONFIG_RECORD_BYTES = struct.calcsize(CONFIG_RECORD_FORMAT)
CONFIG_ACK = b"s"  # what the upstream host library sends to ack a configuration record
CONFIG_RECORD_OK = b"S"
CONFIG_DONE = b"D"
STOP_TERMINATOR = b"\xff\x3f"
STOP_TERMINATOR_FULL = STOP_TERMINATOR * 2
COUNTER_BYTES = 4
VERSION_MAX_BYTES = 64
FULL_SCALE_V = 3.3
MAX_LEVEL = 1023
DEVICE_CLOCK_WRAP_US = 1024
WRAP_NS = DEVICE_CLOCK_WRAP_US * 1000
# a streak of reads this long, every one later than the envelope's slack and none showing a
# break, is a hole the device clock cannot show (see DeviceClock), not data that waited
HIDDEN_HOLE_CONFIRM_NS = 1_000_000_000
# a streak this long of reads all over a quarter hole late fits no whole number of holes
# (the reads, or the envelope before it, were that late: a loaded host), yet is a hole: one,
# at least
HIDDEN_HOLE_BOUND_NS = 5_000_000_000
LINE_RATE_BYTES_PER_S = 20_000 * FRAME_BYTES
# One poll decodes at most this much: at the 3.6 MB/s the decoder holds on any bytes (10x
# the device's 20 kHz x 18 bytes; bench/decode.py) that is under 37 ms, within a poll's
# 0.25 s, and 0.36 s of stream, so a backlog drains at over 3x the line rate
READ_MAX_BYTES = 1 << 17
# Between two reads of the stream: 1.8 kB arrive at 20 kHz, under the 4 kB a Linux tty
# holds before it throttles a USB CDC device (which then loses frames), in 200 wake-ups a
# second instead of one per USB packet or pty write (~400 on the emulator; issue 39).
# A read that brings over two paces' worth means the host is behind: read on at once.
READ_PACE_S = 0.005

# High bits each of the 18 frame bytes must carry: (mask, expected) per position.
_FRAME_MASK = np.array(
    [0xF0, 0xC0] + [0xF0, 0x80] * 7 + [0xF0, 0xC0], dtype=np.uint8
)
_FRAME_EXPECT = np.array(
    [0xF0, 0x40] + [v for i in range(N_SENSORS) for v in (0x80 | (i << 4), 0x00)],
    dtype=np.uint8,
)


@dataclass(frozen=True)
class SensorConfig:
    """One sensor's record in the device (type, pair name, vref V, sensitivity, in use)."""

    type: str
    pair_name: str
    vref_v: float
    sensitivity: float
    in_use: bool

    def pack(self) -> bytes:
        """The 41-byte little-endian packed record the firmware stores."""
        return struct.pack(
            CONFIG_RECORD_FORMAT, self.type.encode("ascii")[:16],
            self.pair_name.encode("ascii")[:16], self.vref_v, self.sensitivity, self.in_use,
        )

    @staticmethod
    def unpack(record: bytes, port: str = "powersensor3", index: int = 0) -> SensorConfig:
        if len(record) != CONFIG_RECORD_BYTES:
            raise MeterProtocolError(
                f"{port}: configuration record {index} has {len(record)} bytes, "
                f"expected {CONFIG_RECORD_BYTES}"
            )
        kind, name, vref, sens, in_use = struct.unpack(CONFIG_RECORD_FORMAT, record)
        return SensorConfig(
            kind.split(b"\0", 1)[0].decode("ascii", "replace"),
            name.split(b"\0", 1)[0].decode("ascii", "replace"),
            float(vref), float(sens), bool(in_use),
        )

    def to_json(self) -> dict[str, object]:
        return {"type": self.type, "pair_name": self.pair_name, "vref_v": self.vref_v,
                "sensitivity": self.sensitivity, "in_use": self.in_use}


# ---------------------------------------------------------------------------------------
# Frame decoder
# ---------------------------------------------------------------------------------------
@dataclass
class DecodedFrames:
    """Frames decoded from one ``feed``; ``skip_events`` = (index of next frame, bytes)."""

    levels: npt.NDArray[np.uint16]
    marker: npt.NDArray[np.bool_]
    device_t_us: npt.NDArray[np.uint16]
    resync: npt.NDArray[np.bool_]
    skipped_bytes: int = 0
    skip_events: list[tuple[int, int]] = field(default_factory=list)
    stopped: bool = False

    @property
    def n(self) -> int:
        return int(self.device_t_us.shape[0])


def _decode_rows(rows: npt.NDArray[np.uint8]) -> tuple[
        npt.NDArray[np.uint16], npt.NDArray[np.bool_], npt.NDArray[np.uint16]]:
    r = rows.astype(np.uint16)
    levels = ((r[:, 2::2] & 0x0F) << 6) | (r[:, 3::2] & 0x3F)
    marker = (rows[:, 3] & 0x40) != 0
    t = ((r[:, 0] & 0x0F) << 6) | (r[:, 1] & 0x3F)
    return levels.astype(np.uint16), marker, t.astype(np.uint16)


def frame_starts(buf: npt.NDArray[np.uint8], lo: int = 0) -> npt.NDArray[np.bool_]:
    """True at each offset ≥ ``lo`` where a whole frame with every byte's fixed bits starts.

    Why this way: every offset is checked at once, the first two bytes over the whole
    buffer and the other sixteen only where those held, so no pattern of bytes costs more
    than a pass or two (a run of 0xF0 took a Python step per byte: 116 kB/s, issue 36).
    """
    n = buf.shape[0]
    out = np.zeros(n, dtype=bool)
    m = n - FRAME_BYTES + 1
    if m <= lo:
        return out
    idx = lo + np.flatnonzero(((buf[lo:m] & _FRAME_MASK[0]) == _FRAME_EXPECT[0])
                              & ((buf[lo + 1:m + 1] & _FRAME_MASK[1]) == _FRAME_EXPECT[1]))
    for j in range(2, FRAME_BYTES):
        idx = idx[(buf[idx + j] & _FRAME_MASK[j]) == _FRAME_EXPECT[j]]
    out[idx] = True
    return out


# The masks repeated over a whole read (and the carry), made once
_TILED_FRAMES = READ_MAX_BYTES // FRAME_BYTES + 1
_FRAME_MASK_TILED = np.tile(_FRAME_MASK, _TILED_FRAMES)
_FRAME_EXPECT_TILED = np.tile(_FRAME_EXPECT, _TILED_FRAMES)


def aligned_frames(buf: npt.NDArray[np.uint8]) -> int:
    """How many whole frames from offset 0 carry every byte's fixed bits, in a row.

    Why over the flat bytes against the masks repeated: one pass, where comparing
    ``(frames, 18)`` rows against the 18-byte mask broadcast took ten times as long and
    was most of a read's decoding (issue 39).
    """
    k = buf.shape[0] // FRAME_BYTES
    size = FRAME_BYTES * k
    if k <= _TILED_FRAMES:
        mask, expect = _FRAME_MASK_TILED[:size], _FRAME_EXPECT_TILED[:size]
    else:
        mask, expect = np.tile(_FRAME_MASK, k), np.tile(_FRAME_EXPECT, k)
    ok = (buf[:size] & mask) == expect
    return k if bool(ok.all()) else int(np.argmin(ok)) // FRAME_BYTES


def run_length(starts: npt.NDArray[np.bool_], p: int, stride: int) -> int:
    """How many of ``starts[p], starts[p + stride], ...`` hold in a row.

    Looked at in growing steps, so a short run costs little and a long one one pass.
    """
    j, step = 0, 16
    while True:
        seg = starts[p + stride * j:p + stride * (j + step):stride]
        if not seg.all():
            return j + int(np.argmin(seg))
        j += int(seg.shape[0])
        if seg.shape[0] < step:
            return j
        step *= 4


class FrameDecoder:
    """Turns the 18-byte frame stream into arrays, whole blocks at a time.

    Every offset of a read is checked for a frame start at once (``frame_starts``); runs of
    frames 18 bytes apart are taken whole, and where one ends the next frame start (or the
    ``FF 3F`` stop terminator, or a possible partial frame at the end) is looked up, every
    byte before it dropped and counted. A partial frame at the end is kept for the next
    ``feed``. ``stop_on_terminator`` is switched off while streaming: the firmware sends
    ``FF 3F`` only after ``X``, and two corrupt bytes must not end a live acquisition.
    Invariant, for tests: ``18 · frames + skipped + pending_bytes + ignored_bytes`` equals
    the bytes fed.
    """

    def __init__(self, stop_on_terminator: bool = True) -> None:
        self.stop_on_terminator = stop_on_terminator
        self.reset()

    def reset(self) -> None:
        """Forget everything: a new stream starts (after ``S``)."""
        self._carry = b""
        self._resync_pending = False
        self.stopped = False
        self.ignored_bytes = 0

    @property
    def pending_bytes(self) -> int:
        return len(self._carry)

    def feed(self, data: bytes) -> DecodedFrames:
        """Decode ``data`` (plus what was kept from the last call)."""
        if self.stopped:
            self.ignored_bytes += len(data)
            return _empty(stopped=True)
        buf = np.frombuffer(self._carry + data, dtype=np.uint8)
        self._carry = b""
        n = buf.shape[0]
        p = 0
        blocks: list[npt.NDArray[np.uint8]] = []
        starts: list[int] = []  # frame index at which a block follows a skip
        n_frames = skipped = 0
        events: list[tuple[int, int]] = []
        stopped = False
        valid: npt.NDArray[np.bool_] | None = None  # found once the first run ends
        resume = np.zeros(0, dtype=np.intp)  # offsets where decoding can go on
        while True:
            if valid is None:  # the common case: aligned frames to the end, one check
                j = aligned_frames(buf)
            else:
                j = run_length(valid, p, FRAME_BYTES) if p < n and valid[p] else 0
            if j:
                blocks.append(buf[p:p + FRAME_BYTES * j].reshape(j, FRAME_BYTES))
                if self._resync_pending:
                    starts.append(n_frames)
                    self._resync_pending = False
                n_frames += j
                p += FRAME_BYTES * j
            if valid is None:
                valid = frame_starts(buf, p)
                resume = np.sort(np.concatenate([np.flatnonzero(valid), self._terminators(buf, p),
                                                 _partial_frames(buf, p)]))
            i = int(np.searchsorted(resume, p))
            q = int(resume[i]) if i < resume.shape[0] else n
            if q > p:
                skipped += q - p
                events.append((n_frames, q - p))
                self._resync_pending = True
            p = q
            if p < n and valid[p]:
                continue
            if self.stop_on_terminator and p + 1 < n and buf[p] == 0xFF and buf[p + 1] == 0x3F:
                stopped = self.stopped = True
                self.ignored_bytes += n - p
            else:
                self._carry = buf[p:].tobytes()
            break
        if not blocks:
            out = _empty(stopped=stopped)
        else:
            levels, marker, t = _decode_rows(np.concatenate(blocks))
            resync = np.zeros(n_frames, dtype=bool)
            resync[starts] = True
            out = DecodedFrames(levels, marker, t, resync)
        out.skipped_bytes = skipped
        out.skip_events = events
        out.stopped = stopped
        return out

    def _terminators(self, buf: npt.NDArray[np.uint8], lo: int) -> npt.NDArray[np.intp]:
        if not self.stop_on_terminator:
            return np.zeros(0, dtype=np.intp)
        return lo + np.flatnonzero((buf[lo:-1] == STOP_TERMINATOR[0])
                                   & (buf[lo + 1:] == STOP_TERMINATOR[1]))


_TAIL_K = np.arange(FRAME_BYTES - 1)


def _partial_frames(buf: npt.NDArray[np.uint8], lo: int) -> npt.NDArray[np.intp]:
    """Offsets ≥ ``lo`` in the last 17 bytes where a frame may start whose rest is to come."""
    first = max(lo, buf.shape[0] - FRAME_BYTES + 1)
    tail = buf[first:]
    r = tail.shape[0]
    if r == 0:
        return np.zeros(0, dtype=np.intp)
    pos = np.arange(r)[:, None] + _TAIL_K[None, :]
    b = tail[np.minimum(pos, r - 1)]
    ok = ((b & _FRAME_MASK[:-1]) == _FRAME_EXPECT[:-1]) | (pos >= r)
    return first + np.flatnonzero(ok.all(axis=1))


def _empty(stopped: bool = False) -> DecodedFrames:
    return DecodedFrames(np.zeros((0, N_SENSORS), dtype=np.uint16), np.zeros(0, dtype=bool),
                         np.zeros(0, dtype=np.uint16), np.zeros(0, dtype=bool), stopped=stopped)


# ---------------------------------------------------------------------------------------
# Device clock
# ---------------------------------------------------------------------------------------
@dataclass
class UnwrappedTimes:
    """Per-sample device time (µs, unwrapped) and host monotonic time (ns)."""

    t_device_us: npt.NDArray[np.int64]
    t_host_ns: npt.NDArray[np.int64]
    estimated: npt.NDArray[np.bool_]
    # frames from which a hidden hole's count is a lower bound (see DeviceClock)
    at_least: list[int] = field(default_factory=list)


@dataclass
class LateStreak:
    """Batches in a row later than ``threshold_ns`` past the clock's envelope.

    Since when, and the least lateness of those after the first. Why not the first: it may
    have read the frames before a hole during the hole's silence, late by part of it only.
    """

    threshold_ns: int
    since_ns: int | None = None
    least_ns: int | None = None

    def update(self, excess_ns: int, host_read_ns: int) -> int:
        """The streak's length (ns) with this batch; 0 while it has no ``least_ns``."""
        if excess_ns <= self.threshold_ns:
            self.end()
            return 0
        if self.since_ns is None:
            self.since_ns = host_read_ns
            return 0
        self.least_ns = excess_ns if self.least_ns is None else min(self.least_ns, excess_ns)
        return host_read_ns - self.since_ns

    def end(self) -> None:
        self.since_ns = self.least_ns = None


class DeviceClock:
    """Unwraps the 10-bit µs timestamp and maps it onto the host's monotonic clock.

    Consecutive frames are ~50 µs apart, so the modular difference of neighbours is the
    true step. The device → host offset is the lower envelope of ``read time − device time
    of the newest sample`` (a sample is always read after it was taken), allowed to creep
    up by ``drift_ppm`` for crystal drift; a change is slewed over a batch so host times
    stay monotonic. When a read lands more than ``slack_ns`` later than the envelope
    predicts *and* the stream shows a break (a step other than one frame period, or bytes
    the decoder skipped), whole 1024 µs wraps were lost with it: the time is re-anchored on
    the host clock from the break on and those samples are flagged ``ESTIMATED_TIME``. A
    late read with an unbroken stream is data that waited in the OS or USB buffers (a busy
    host), not lost data: the envelope stands. Host times always increase.

    But a hole of a whole number of ``hidden_us`` (the least common multiple of the frame
    period and the wrap: 512 frames, 25.6 ms) leaves no odd step at all. Data that waited
    is read sooner or later, and the reads come back to the envelope; after such a hole they
    never do. So a streak of ``HIDDEN_HOLE_CONFIRM_NS`` in which every read is past the slack
    without a break, and the least lateness (after the streak's first batch, which may have
    read the frames before the hole during its silence) is within a quarter of ``hidden_us``
    of a whole number of them, is that many hidden holes' worth of lost frames: the times are
    re-anchored from that read on (flagged ``ESTIMATED_TIME``), so the device clock steps by
    the hole there. The reads of the streak itself kept the old anchor: their times are
    early by the hole, and the gap is placed up to the streak's length after it. A streak of
    ``HIDDEN_HOLE_BOUND_NS`` of batches all over a quarter hole late, fitting no whole number
    (the reads after the hole, or those the envelope came from before it, were that late),
    is one hole at least (``at_least``), and the envelope moves onto the streak's reads.

    Every read counts, not only a batch's last: ``reads`` gives (newest frame, host time) of
    each read in the batch. Why: one stamp per batch put the envelope at whatever lateness
    the first batch's stamp had (a loaded host: 5-40 ms); a hole's reads then fell under the
    slack by that much, and a 512-frame hole went unreported (a loaded fresh clone).
    """

    def __init__(self, slack_ns: int = 20_000_000, drift_ppm: float = 200.0,
                 period_us: int = 50) -> None:
        self.slack_ns = slack_ns
        self.drift_ppm = drift_ppm
        self.period_us = period_us
        self.hidden_us = math.lcm(period_us, DEVICE_CLOCK_WRAP_US)
        self.reset()

    def reset(self) -> None:
        """Forget the anchor (a new stream: the device clock may have run meanwhile)."""
        self._last_raw: int | None = None
        self._last_dev_us = 0
        self._offset_ns = 0
        self._last_read_ns = 0
        self._last_host_ns: int | None = None
        self._late = LateStreak(self.slack_ns)  # past the slack: holes counted exactly
        self._behind = LateStreak(self.hidden_us * 1000 // 4)  # one at least

    @property
    def offset_ns(self) -> int:
        return self._offset_ns

    def unwrap(self, t10: npt.NDArray[np.uint16], host_read_ns: int,
               breaks: Sequence[int] = (),
               reads: Sequence[tuple[int, int]] = ()) -> UnwrappedTimes:
        """Times for frames read by ``host_read_ns``; ``breaks``: frame indices after lost data.

        ``reads``: (index of the newest frame read, host ns) of earlier reads of the batch.
        """
        n = int(t10.shape[0])
        estimated = np.zeros(n, dtype=bool)
        if n == 0:
            empty = np.zeros(0, dtype=np.int64)
            return UnwrappedTimes(empty, empty.copy(), estimated)
        t = t10.astype(np.int64) & (DEVICE_CLOCK_WRAP_US - 1)
        first = self._last_raw is None
        prev_raw = int(t[0]) if self._last_raw is None else self._last_raw
        steps = np.diff(t, prepend=prev_raw) % DEVICE_CLOCK_WRAP_US
        # Two frames never share an instant: a zero step is a whole wrap lost between them.
        later = steps[1:] if first else steps
        later[later == 0] = DEVICE_CLOCK_WRAP_US
        dev = (int(t[0]) if first else self._last_dev_us) + np.cumsum(steps)
        odd = np.flatnonzero(steps != self.period_us)
        all_breaks = sorted({int(b) for b in breaks} | {int(i) for i in odd if i or not first})
        # after a break only the reads of frames past it say how many wraps were lost
        candidate = least_lateness(dev, host_read_ns, reads, all_breaks[0] if all_breaks else 0)
        at = n  # first sample on a new anchor (n: none)
        at_least: list[int] = []
        if first:
            offset = candidate
        else:
            elapsed = max(0, host_read_ns - self._last_read_ns)
            allowed = self._offset_ns + int(elapsed * self.drift_ppm * 1e-6)
            excess = candidate - allowed
            if excess > self.slack_ns and all_breaks:
                # Read latency only adds, so round down, forgiving 100 µs of clock jitter.
                wraps = (candidate - self._offset_ns + 100_000) // WRAP_NS
                at = all_breaks[0]
                dev[at:] += wraps * DEVICE_CLOCK_WRAP_US
                estimated[at:] = True
                candidate -= wraps * WRAP_NS
                self._late.end()
                self._behind.end()
            elif (hole := self._hidden_holes(excess, host_read_ns))[0] > 0:
                holes, shift_ns = hole
                at = 0
                dev += holes * self.hidden_us
                estimated[:] = True
                candidate -= holes * self.hidden_us * 1000
                if shift_ns is not None:
                    allowed += shift_ns
                    at_least = [0]
            offset = min(candidate, allowed)
        if first:
            offsets = np.full(n, offset, dtype=np.int64)
        elif at < n:
            offsets = np.full(n, self._offset_ns, dtype=np.int64)
            offsets[at:] = offset
        else:
            # Slew a changed offset across the batch (at most half its span) so host
            # times stay monotonic instead of stepping back when the envelope drops.
            span_ns = (int(dev[-1]) - self._last_dev_us) * 1000
            change = int(np.clip(offset - self._offset_ns, -span_ns // 2, span_ns // 2))
            offset = self._offset_ns + change
            offsets = self._offset_ns + (change * np.arange(1, n + 1, dtype=np.int64)) // n
        t_host = (dev * 1000 + offsets).astype(np.int64)
        before = self._last_host_ns if at == 0 else int(t_host[at - 1])
        if at < n and before is not None and t_host[at] <= before:
            # The wrap count came out short (read jitter on the rounding): the samples
            # after the break come after the ones before it, so whole wraps are added.
            wraps = -(-(before - int(t_host[at]) + 1) // WRAP_NS)
            dev[at:] += wraps * DEVICE_CLOCK_WRAP_US
            t_host[at:] += wraps * WRAP_NS
        self._offset_ns = offset
        self._last_raw = int(t[-1])
        self._last_dev_us = int(dev[-1])
        self._last_read_ns = host_read_ns
        t_host = strictly_increasing(t_host, self._last_host_ns)
        self._last_host_ns = int(t_host[-1])
        return UnwrappedTimes(dev.astype(np.int64), t_host, estimated, at_least)

    def _hidden_holes(self, excess_ns: int, host_read_ns: int) -> tuple[int, int | None]:
        """How many ``hidden_us`` holes the streaks of late unbroken batches prove (class doc).

        With how far the envelope moves where that count is a lower bound (None: exact).
        """
        late_ns = self._late.update(excess_ns, host_read_ns)
        behind_ns = self._behind.update(excess_ns, host_read_ns)
        hidden_ns = self.hidden_us * 1000
        least = self._late.least_ns
        if late_ns >= HIDDEN_HOLE_CONFIRM_NS and least is not None:
            holes = round(least / hidden_ns)
            if holes >= 1 and abs(least - holes * hidden_ns) <= hidden_ns // 4:
                self._late.end()
                self._behind.end()
                return holes, None
        least = self._behind.least_ns
        if behind_ns < HIDDEN_HOLE_BOUND_NS or least is None:
            return 0, None
        # the reads say only that frames were lost (they never came back), not how many
        self._late.end()
        self._behind.end()
        return 1, least - hidden_ns


def least_lateness(dev_us: npt.NDArray[np.int64], host_read_ns: int,
                   reads: Sequence[tuple[int, int]], lo: int) -> int:
    """The least ``read time − device time of the newest frame read`` over a batch's reads.

    Of frames from ``lo`` on; the last read is ``host_read_ns``, of the batch's last frame.

    Why the least: a read only adds lateness (a busy host stamps it late), so the least of
    a batch's reads is the nearest to the device → host offset.
    """
    best = host_read_ns - int(dev_us[-1]) * 1000
    if reads:
        idx = np.array([i for i, _ in reads], dtype=np.intp)
        t_ns = np.array([t for _, t in reads], dtype=np.int64)
        keep = (idx >= lo) & (idx < dev_us.shape[0])
        if keep.any():
            best = min(best, int((t_ns[keep] - dev_us[idx[keep]] * 1000).min()))
    return best


def strictly_increasing(t_ns: npt.NDArray[np.int64], after_ns: int | None) -> npt.NDArray[np.int64]:
    """Each time at least 1 ns after the one before (and after ``after_ns``).

    Why: a slewed offset over a batch of uneven steps can still put a sample at or before
    its predecessor; two samples are never taken at one instant, and the run file's time
    axis must say which came first.
    """
    index = np.arange(t_ns.shape[0], dtype=np.int64)
    floor = np.iinfo(np.int64).min if after_ns is None else after_ns + 1
    return np.maximum.accumulate(np.maximum(t_ns - index, floor)) + index


# ---------------------------------------------------------------------------------------
# Scaling
# ---------------------------------------------------------------------------------------
VREF_RANGE_V = (0.0, FULL_SCALE_V)
SENSITIVITY_RANGE = (1e-3, 10.0)  # |V per A| or |V per V|


def check_physical(sensor: SensorConfig, index: int, port: str) -> None:
    """Refuse a record in use whose numbers no sensor has (issue 36 item 10).

    Its readings would be NaN, inf or 1e30 W with no flag.
    ``vref_v`` is the ADC voltage at zero current (or zero volts): the ADC reads 0..3.3 V,
    so a zero point outside that range is no sensor's. ``sensitivity`` (V per A, or V per V
    of the voltage divider; negative inverts): under 1e-3 in magnitude the ADC's 3.3 V span
    would be over 3,300 A or V, beyond any riser or cable; over 10 it would be under
    0.33 A or V, which measures no GPU rail.
    """
    where = f"{port}: sensor {index} (pair {index // 2}, {sensor.type or 'no type'})"
    lo, hi = VREF_RANGE_V
    if not lo <= sensor.vref_v <= hi:  # NaN fails every comparison
        raise MeterError(
            f"{where} is in use with vref_v {sensor.vref_v!r}: the zero point must lie in "
            f"the ADC's range {lo:g}..{hi:g} V (3.3 V full scale); fix the device's "
            f"configuration (write_config) before recording")
    lo, hi = SENSITIVITY_RANGE
    if not lo <= abs(sensor.sensitivity) <= hi:
        raise MeterError(
            f"{where} is in use with sensitivity {sensor.sensitivity!r}: a physical sensor "
            f"has {lo:g}..{hi:g} V per A (or V per V) in magnitude, else the 3.3 V ADC span "
            f"is over 3,300 A or under 0.33 A; fix the device's configuration (write_config) "
            f"before recording")


class Scaling:
    """Levels → SI values per active pair (current A, voltage V, power W) and their total."""

    def __init__(self, config: Sequence[SensorConfig], port: str = "powersensor3") -> None:
        if len(config) != N_SENSORS:
            raise MeterProtocolError(f"{port}: {len(config)} sensor records, expected 8")
        self.config = list(config)
        self.pairs = [p for p in range(N_PAIRS)
                      if config[2 * p].in_use and config[2 * p + 1].in_use]
        if not self.pairs:
            raise MeterError(f"{port}: no sensor pair has both sensors in use; nothing to read")
        for p in self.pairs:
            for s in (2 * p, 2 * p + 1):
                check_physical(config[s], s, port)
        self.sensors = [s for p in self.pairs for s in (2 * p, 2 * p + 1)]
        vref = np.array([config[s].vref_v for s in self.sensors])
        sens = np.array([config[s].sensitivity for s in self.sensors])
        # Each sensor's value at every one of the 1024 levels, by the formula ``convert``
        # states: a look-up per sample instead of the arithmetic (a fifth of the CPU, and
        # the same float64 numbers bit for bit, issue 39)
        level = np.arange(MAX_LEVEL + 1)
        self._table = np.ascontiguousarray(
            ((FULL_SCALE_V * level[:, None] / MAX_LEVEL - vref) / sens).T)

    def channels(self) -> list[Channel]:
        out: list[Channel] = []
        for p in self.pairs:
            ci, cv = self.config[2 * p], self.config[2 * p + 1]
            name = ci.pair_name or f"pair {p}"
            out += [
                Channel(f"current{p}_a", "A", f"{name} current, sensor {2 * p} ({ci.type})"),
                Channel(f"voltage{p}_v", "V", f"{name} voltage, sensor {2 * p + 1} ({cv.type})"),
                Channel(f"power{p}_w", "W", f"{name} power, sensors {2 * p}·{2 * p + 1}"),
            ]
        out.append(Channel("power_total_w", "W", "sum of the power of every active pair"))
        return out

    def convert(self, levels: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
        """``(3.3 · level / 1023 − vref) / sensitivity``; negative sensitivity inverts.

        Current, voltage and power per pair, then the pairs' power summed from +0.0 in
        pair order (so -0.0 W on every pair totals +0.0), in float64, stored as float32.
        """
        n = levels.shape[0]
        out = np.empty((n, 3 * len(self.pairs) + 1), dtype=np.float32)
        total = np.zeros(n)
        for j in range(len(self.pairs)):
            current = self._table[2 * j].take(levels[:, self.sensors[2 * j]])
            voltage = self._table[2 * j + 1].take(levels[:, self.sensors[2 * j + 1]])
            power = current * voltage
            out[:, 3 * j] = current
            out[:, 3 * j + 1] = voltage
            out[:, 3 * j + 2] = power
            total += power
        out[:, -1] = total
        return out


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------
@dataclass
class StreamBlock:
    """Decoded, timed and scaled samples from one read of the stream."""

    t_host_ns: npt.NDArray[np.int64]
    t_device_us: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    flags: npt.NDArray[np.uint8]
    marker_index: npt.NDArray[np.intp]
    skipped_bytes: int = 0
    skip_events: list[tuple[int, int]] = field(default_factory=list)
    stopped: bool = False
    # frames from which a hidden hole's count (the device clock's step) is a lower bound
    at_least: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return int(self.t_host_ns.shape[0])


@dataclass(frozen=True)
class DeviceInfo:
    """What ``connect`` learnt: the firmware line and the eight sensor records."""

    firmware: str
    config: tuple[SensorConfig, ...]


class PowerSensor3:
    """The device's commands as methods; nothing is sent before ``connect``."""

    def __init__(self, transport: ByteTransport, name: str | None = None,
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 drain_timeout_s: float = 1.0,
                 sleep_s: Callable[[float], None] = time.sleep) -> None:
        self.transport = transport
        self.port = name or str(getattr(transport, "port_name", "powersensor3"))
        self.clock_ns = clock_ns  # with sleep_s, what a test injects to run a host's timing
        self.sleep_s = sleep_s
        self.drain_timeout_s = drain_timeout_s
        self.decoder = FrameDecoder()
        self.clock = DeviceClock()
        self.firmware = ""
        self.config: list[SensorConfig] = []
        self.scaling: Scaling | None = None

    # -- session ---------------------------------------------------------------------------
    def connect(self) -> DeviceInfo:
        """Stop any stream left running, then read firmware version and configuration."""
        self.stop_and_flush()
        self.firmware = self.read_version()
        self.config = self.read_config()
        self.scaling = Scaling(self.config, self.port)
        return DeviceInfo(self.firmware, tuple(self.config))

    def _send(self, cmd: Command) -> None:
        self.transport.write(cmd.value)

    def read_version(self) -> str:
        """``V`` → firmware line such as ``F411-1.6.1``."""
        self._send(Command.VERSION)
        line = bytearray()
        while not line.endswith(b"\n"):
            line += self.transport.read(1)
            if len(line) > VERSION_MAX_BYTES:
                raise MeterProtocolError(f"{self.port}: version reply too long: {bytes(line)!r}")
        text = line.rstrip(b"\r\n")
        if not text or any(b < 0x20 or b > 0x7E for b in text):
            raise MeterProtocolError(f"{self.port}: version reply is not text: {bytes(line)!r}")
        return text.decode("ascii")

    def read_config(self) -> list[SensorConfig]:
        """``R``: eight 41-byte records, each acked by the host, then ``D``."""
        self._send(Command.READ_CONFIG)
        out = []
        for i in range(N_SENSORS):
            record = self.transport.read(CONFIG_RECORD_BYTES)
            out.append(SensorConfig.unpack(record, self.port, i))
            self.transport.write(CONFIG_ACK)
        self._expect(CONFIG_DONE, "after the configuration records")
        return out

    def write_config(self, config: Sequence[SensorConfig]) -> None:
        """``W``: eight 41-byte records, each answered ``S``, then ``D``."""
        if len(config) != N_SENSORS:
            raise MeterError(f"{self.port}: configuration needs 8 records, got {len(config)}")
        self._send(Command.WRITE_CONFIG)
        for i, record in enumerate(config):
            self.transport.write(record.pack())
            self._expect(CONFIG_RECORD_OK, f"after configuration record {i}")
        self._expect(CONFIG_DONE, "after writing the configuration")
        self.config = list(config)
        self.scaling = Scaling(self.config, self.port)

    def _expect(self, reply: bytes, where: str) -> None:
        got = self.transport.read(len(reply))
        if got != reply:
            raise MeterProtocolError(f"{self.port}: expected {reply!r} {where}, got {got!r}")

    def read_counter(self) -> int:
        """``Q`` → conversions since the last ``S`` (uint32 LE)."""
        self._send(Command.COUNTER)
        return int(struct.unpack("<I", self.transport.read(COUNTER_BYTES))[0])

    def read_single_frame(self) -> DecodedFrames:
        """``I`` → one frame (decoded on its own, outside the stream)."""
        self._send(Command.SINGLE_FRAME)
        raw = self.transport.read(FRAME_BYTES)
        frames = FrameDecoder().feed(raw)
        if frames.n != 1:
            raise MeterProtocolError(f"{self.port}: reply to 'I' is not a frame: {raw.hex(' ')}")
        return frames

    def mark(self) -> None:
        """``M``: the device sets the marker bit on its next frame."""
        self._send(Command.MARKER)

    def start(self) -> None:
        """``S``: stream frames; the decoder and clock start afresh."""
        self.decoder.reset()
        self.decoder.stop_on_terminator = False
        self.clock.reset()
        self._send(Command.START)

    def stop(self) -> None:
        """``T``: stop streaming (frames already in flight still arrive)."""
        self._send(Command.STOP)

    def stop_and_flush(self, timeout_s: float | None = None) -> StreamBlock:
        """``X`` and read to the terminator, keeping frames and markers that came before it."""
        limit = self.drain_timeout_s if timeout_s is None else timeout_s
        if self.decoder.stopped:
            self.decoder.reset()
        self.decoder.stop_on_terminator = True
        self._send(Command.STOP_FLUSH)
        deadline = time.monotonic() + limit
        data = bytearray()
        before = self.decoder.ignored_bytes
        frames: list[StreamBlock] = []
        while not self.decoder.stopped:
            if time.monotonic() > deadline:
                raise MeterTimeoutError(
                    f"{self.port}: no stop terminator FF 3F within {limit} s after 'X'"
                )
            data = bytearray(self.transport.read_available(65536))
            if data:
                frames.append(self._block(bytes(data), self.clock_ns()))
        tail = self.decoder.ignored_bytes - before
        if tail < len(STOP_TERMINATOR_FULL):
            # the second half of FF 3F FF 3F, if the firmware sends it
            with contextlib.suppress(MeterTimeoutError):
                self.transport.read(len(STOP_TERMINATOR_FULL) - tail)
        return _concat(frames)

    # -- streaming -------------------------------------------------------------------------
    def read_stream(self, min_duration_s: float = 0.0, max_bytes: int = READ_MAX_BYTES,
                    pace_s: float = READ_PACE_S) -> StreamBlock:
        """Read what arrives for at least ``min_duration_s``, every ``pace_s``; decode it once.

        A read fuller than two paces of the line rate is a backlog: no pause before the next.
        Each read's host time goes to the clock with the bytes it brought (``DeviceClock``).
        """
        deadline_ns = self.clock_ns() + int(min_duration_s * 1e9)
        behind_bytes = 2 * pace_s * LINE_RATE_BYTES_PER_S
        data = bytearray()
        reads: list[tuple[int, int]] = []  # (bytes read so far, host ns just after)
        while True:
            got = self.transport.read_available(max_bytes - len(data))
            now_ns = self.clock_ns()
            data += got
            if got:
                reads.append((len(data), now_ns))
            left_s = (deadline_ns - now_ns) / 1e9
            if left_s <= 0 or len(data) >= max_bytes:
                break
            if len(got) < behind_bytes:
                self.sleep_s(min(pace_s, left_s))
        return self._block(bytes(data), self.clock_ns(), reads)

    def _block(self, data: bytes, host_read_ns: int,
               reads: Sequence[tuple[int, int]] = ()) -> StreamBlock:
        carried = self.decoder.pending_bytes
        frames = self.decoder.feed(data)
        breaks = [i for i, _ in frames.skip_events if i < frames.n]
        read_frames = newest_frames_read(frames, carried, reads)
        times = self.clock.unwrap(frames.device_t_us, host_read_ns, breaks, read_frames)
        flags = np.zeros(frames.n, dtype=np.uint8)
        flags[frames.resync] |= np.uint8(SampleFlag.RESYNC)
        flags[frames.marker] |= np.uint8(SampleFlag.MARKER)
        flags[times.estimated] |= np.uint8(SampleFlag.ESTIMATED_TIME)
        if self.scaling is None:  # frames left over from an earlier host, before connect
            values = np.zeros((frames.n, 0), dtype=np.float32)
        else:
            values = self.scaling.convert(frames.levels)
        return StreamBlock(
            times.t_host_ns, times.t_device_us, values, flags,
            np.flatnonzero(frames.marker), frames.skipped_bytes, frames.skip_events,
            frames.stopped, times.at_least,
        )


def newest_frames_read(frames: DecodedFrames, carried_bytes: int,
                       reads: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(index of the newest whole frame, host ns) after each read of ``(bytes so far, ns)``.

    Frame ``j`` ends ``18 (j + 1)`` bytes into what was decoded (the carried bytes first),
    plus the bytes skipped before it: a frame counts as read only once its last byte was,
    so no read is taken for earlier than it was (which would make later ones look late).
    """
    if not reads or frames.n == 0:
        return []
    skipped = np.zeros(frames.n + 1, dtype=np.int64)
    for i, nbytes in frames.skip_events:
        skipped[min(i, frames.n)] += nbytes
    ends = FRAME_BYTES * np.arange(1, frames.n + 1, dtype=np.int64) + np.cumsum(skipped)[:-1]
    got = np.array([carried_bytes + b for b, _ in reads], dtype=np.int64)
    newest = np.searchsorted(ends, got, side="right") - 1
    return [(int(j), t) for j, (_, t) in zip(newest.tolist(), reads, strict=True) if j >= 0]


def _concat(blocks: list[StreamBlock]) -> StreamBlock:
    if not blocks:
        z = np.zeros(0, dtype=np.int64)
        return StreamBlock(z, z.copy(), np.zeros((0, 0), dtype=np.float32),
                           np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.intp), stopped=True)
    offsets = np.cumsum([0] + [b.n for b in blocks])
    return StreamBlock(
        np.concatenate([b.t_host_ns for b in blocks]),
        np.concatenate([b.t_device_us for b in blocks]),
        np.concatenate([b.values for b in blocks]),
        np.concatenate([b.flags for b in blocks]),
        np.concatenate([b.marker_index + o for b, o in zip(blocks, offsets, strict=False)]),
        sum(b.skipped_bytes for b in blocks),
        [(i + int(o), k) for b, o in zip(blocks, offsets, strict=False) for i, k in b.skip_events],
        blocks[-1].stopped,
        [i + int(o) for b, o in zip(blocks, offsets, strict=False) for i in b.at_least],
    )
