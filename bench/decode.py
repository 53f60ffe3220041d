"""Decode speed on one core: PowerSensor3 streams, and both serial decoders on faulty bytes.

    python bench/decode.py [--quick]

Clean streams: frames come from the emulator's own encoder (an independent
implementation). Rows: the frame decoder alone, fed in 10 ms reads (what the acquirer
sees) and in 1 s blocks; the same with a corrupt byte every 1,000 frames; and the full
driver path (decode + unwrap the 10-bit device clock + convert to volts/amps/watts).

Faulty-device bytes (issue 36 item 7): the corpus of tests/decoder_corpus.py (random
bytes, periodic patterns of periods 1..64, a run of each byte value 0..255, 256 kB each;
damaged valid streams and the property tests' pinned cases, each repeated to that size),
fed in the reads one poll makes (READ_MAX_BYTES), per decoder setting: the slowest and the
median case in MB/s of input, against 10x the device's line rate, and the longest a poll
then decodes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from common import GOALS_MISSED, median, write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the corpus lives in tests/
from tests.decoder_corpus import PMD_CONFIGS, Case, garbage, pmd_valid, ps3_valid

from wattlab.drivers import pmd, powersensor3
from wattlab.drivers.powersensor3 import (
    DeviceClock,
    FrameDecoder,
    Scaling,
    SensorConfig,
)
from wattlab.hardware.emulators.powersensor3_emulator import PowerSensor3Emulator

RATE_HZ = 20_000
# Line rates, the goal's unit: PowerSensor3 sends 20 kHz x 18-byte frames (docs/meters.md,
# the driver's FRAME_BYTES); the PMD-USB streams at the highest baud the driver sets,
# 2 Mbaud 8N1 = 10 bits a byte (pmd.MAX_BAUD; 115 200 baud, its default, is 11.5 kB/s)
PS3_LINE_BPS = RATE_HZ * powersensor3.FRAME_BYTES
PMD_LINE_BPS = pmd.MAX_BAUD // 10
GOAL_X_LINE = 10


def make_stream(seconds: float, corrupt_every: int | None) -> bytes:
    emu = PowerSensor3Emulator(lambda t: 250.0 + 100.0 * np.sin(t / 1e8), seed=1)
    t_ns = np.arange(int(seconds * RATE_HZ), dtype=np.int64) * 50_000
    frames = emu.encode_frames(t_ns, marker_first=False)
    if corrupt_every is None:
        return frames
    step = 18 * corrupt_every
    parts = [frames[i:i + step] + b"\x12" for i in range(0, len(frames), step)]
    return b"".join(parts)


def time_decode(stream: bytes, chunk: int, full_path: bool, config: list[SensorConfig]) -> float:
    decoder = FrameDecoder(stop_on_terminator=False)
    clock = DeviceClock()
    scaling = Scaling(config)
    t0 = time.process_time()
    frames = 0
    host_ns = 0
    for start in range(0, len(stream), chunk):
        out = decoder.feed(stream[start:start + chunk])
        frames += out.n
        if full_path and out.n:
            host_ns += 10_000_000
            clock.unwrap(out.device_t_us, host_ns, [i for i, _ in out.skip_events if i < out.n])
            scaling.convert(out.levels)
    elapsed = time.process_time() - t0
    return frames / elapsed


def throughput(decode: Callable[[bytes], None], data: bytes, repeat: int) -> float:
    """Bytes per CPU second, best of ``repeat`` (a loaded machine only slows a run)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        decode(data)
        best = min(best, time.process_time() - t0)
    return len(data) / max(best, 1e-9)


def pmd_decode(mask: int, ts_bytes: int) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        dec = pmd.ContinuousDecoder(mask, ts_bytes)
        for i in range(0, len(data), pmd.READ_MAX_BYTES):
            dec.feed(data[i:i + pmd.READ_MAX_BYTES])
        dec.flush()
    return run


def ps3_decode(stop: bool) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        dec = FrameDecoder(stop_on_terminator=stop)
        for i in range(0, len(data), powersensor3.READ_MAX_BYTES):
            dec.feed(data[i:i + powersensor3.READ_MAX_BYTES])
    return run


def tiled(cases: Iterable[Case], size: int) -> list[Case]:
    """Each case repeated to ``size`` bytes: a short damaged stream becomes a device that
    keeps failing that way, and a per-call cost does not pass for a slow decoder."""
    return [Case(c.name, (c.data * (size // len(c.data) + 1))[:size], c.garbage)
            for c in cases]


def faulty_row(setting: str, decode: Callable[[bytes], None], cases: Iterable[Case],
               line_bps: int, read_bytes: int, repeat: int) -> dict[str, Any]:
    rates = sorted((throughput(decode, c.data, repeat), c.name) for c in cases)
    worst_bps, worst_case = rates[0]
    return {"setting": setting, "cases": len(rates), "worst_mb_s": worst_bps / 1e6,
            "worst_case": worst_case, "median_mb_s": rates[len(rates) // 2][0] / 1e6,
            "line_mb_s": line_bps / 1e6, "worst_x_line": worst_bps / line_bps,
            "goal_x_line": GOAL_X_LINE, "read_bytes": read_bytes,
            "worst_poll_ms": 1e3 * read_bytes / worst_bps}


def faulty_rows(quick: bool) -> list[dict[str, Any]]:
    size = 16_384 if quick else 262_144
    runs = range(0, 256, 17) if quick else range(256)
    repeat = 1 if quick else 2
    rows = []
    for mask, ts_bytes in PMD_CONFIGS:
        cases = [*garbage(size, runs), *tiled(pmd_valid(mask, ts_bytes), size)]
        rows.append(faulty_row(f"PMD mask 0x{mask:02X}, {ts_bytes}-byte ticks",
                               pmd_decode(mask, ts_bytes), cases, PMD_LINE_BPS,
                               pmd.READ_MAX_BYTES, repeat))
    for stop in (False, True):
        cases = [*garbage(size, runs), *tiled(ps3_valid(), size)]
        rows.append(faulty_row(f"PowerSensor3, {'stopping' if stop else 'streaming'}",
                               ps3_decode(stop), cases, PS3_LINE_BPS,
                               powersensor3.READ_MAX_BYTES, repeat))
    return rows


def print_faulty(rows: list[dict[str, Any]]) -> None:
    print("\nFaulty-device bytes: MB/s of input, one core, reads of one poll")
    print(f"{'decoder':<32} {'cases':>5} {'worst':>7} {'x line':>7} {'median':>7} "
          f"{'worst case':<12} {'poll ms':>8}")
    for r in rows:
        print(f"{r['setting']:<32} {r['cases']:>5} {r['worst_mb_s']:>7.2f} "
              f"{r['worst_x_line']:>7.1f} {r['median_mb_s']:>7.1f} {r['worst_case']:<12} "
              f"{r['worst_poll_ms']:>8.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seconds = 2.0 if args.quick else 20.0
    repeat = 1 if args.quick else 5
    emu_config = PowerSensor3Emulator(lambda t: 0.0).config
    config = [SensorConfig.unpack(s.pack()) for s in emu_config]
    clean = make_stream(seconds, None)
    corrupt = make_stream(seconds, 1000)
    read_10ms = 18 * RATE_HZ // 100
    cases = [
        ("decoder, 10 ms reads", clean, read_10ms, False),
        ("decoder, 100 ms reads (the acquirer's poll)", clean, 10 * read_10ms, False),
        ("decoder, 1 s blocks", clean, 18 * RATE_HZ, False),
        ("decoder, 10 ms reads, 1 corrupt byte / 1000 frames", corrupt, read_10ms, False),
        ("driver path (decode+unwrap+scale), 10 ms reads", clean, read_10ms, True),
        ("driver path (decode+unwrap+scale), 100 ms reads", clean, 10 * read_10ms, True),
    ]
    rows = []
    print(f"PowerSensor3 decode, {seconds:g} s of 20 kHz stream, median of {repeat}, one core")
    print(f"{'case':<52} {'M frames/s':>11} {'x real time':>12}")
    for name, stream, chunk, full in cases:
        rate = median([time_decode(stream, chunk, full, config) for _ in range(repeat)])
        rows.append({"case": name, "frames_per_s": rate, "x_realtime": rate / RATE_HZ})
        print(f"{name:<52} {rate / 1e6:>11.2f} {rate / RATE_HZ:>12.0f}")
    faulty = faulty_rows(args.quick)
    print_faulty(faulty)
    write_json("decode", {"benchmark": "decode", "quick": args.quick, "rows": rows,
                          "faulty": faulty})
    missed = [r["setting"] for r in faulty if r["worst_x_line"] < GOAL_X_LINE]
    if missed:
        print(f"goal missed (worst case under {GOAL_X_LINE}x the line rate): {missed}")
        return GOALS_MISSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
