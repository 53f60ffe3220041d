"""PowerSensor3 decode speed on one core, as a multiple of the device's 20 kHz frame rate.

    python bench/decode.py [--quick]

Frames come from the emulator's own encoder (an independent implementation). Rows: the
frame decoder alone, fed in 10 ms reads (what the acquirer sees) and in 1 s blocks; the
same with a corrupt byte every 1,000 frames; and the full driver path (decode + unwrap
the 10-bit device clock + convert to volts/amps/watts).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from common import median, write_json
from wattlab.drivers.powersensor3 import DeviceClock, FrameDecoder, Scaling, SensorConfig
from wattlab.hardware.emulators.powersensor3_emulator import PowerSensor3Emulator

RATE_HZ = 20_000


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
    write_json("decode", {"benchmark": "decode", "quick": args.quick, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
