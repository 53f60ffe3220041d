"""Valid PMD-USB and PowerSensor3 byte streams, built from the protocol text, and damage.

Shared by the decoder tests and the decoder corpus (bench/decode.py reads the same cases).
"""

from __future__ import annotations

import struct

import numpy as np

PMD_PERIOD = 5208  # 3 MHz ticks between frames at 115 200 baud with 20-byte frames


def pmd_word(raw12: int) -> int:
    """The u16 a channel carries: 12-bit two's complement shifted left by 4."""
    return (raw12 & 0xFFF) << 4


def pmd_frames(ticks: list[int], raws: list[list[int]], ts_bytes: int) -> bytes:
    out = b""
    for t, r in zip(ticks, raws, strict=True):
        out += (t % (1 << (8 * ts_bytes))).to_bytes(ts_bytes, "little") if ts_bytes else b""
        out += struct.pack(f"<{len(r)}H", *(pmd_word(x) for x in r))
    return out


def pmd_rail_raws(n: int, seed: int = 0, nch: int = 8) -> list[list[int]]:
    """Plausible readings: ~12 V on voltage channels, 0..15 A on currents."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        row = []
        for c in range(nch):
            row.append(int(1586 + rng.integers(-3, 4)) if c % 2 == 0
                       else int(rng.integers(0, 300)))
        out.append(row)
    return out


def pmd_stream(n: int, ts_bytes: int = 4, start: int = 123_456, seed: int = 0, nch: int = 8
               ) -> tuple[bytes, list[int], list[list[int]]]:
    """``n`` frames of ``nch`` channels, ``PMD_PERIOD`` ticks apart: bytes, ticks, readings."""
    ticks = [start + PMD_PERIOD * k for k in range(n)]
    raws = pmd_rail_raws(n, seed, nch)
    return pmd_frames(ticks, raws, ts_bytes), ticks, raws


def damage(data: bytes, edits: list[tuple[int, str, int]], seed: int) -> bytes:
    """Apply (position, "drop" | "insert", count) edits, back to front; inserts are random."""
    rng = np.random.default_rng(seed)
    bad = bytearray(data)
    for pos, kind, k in sorted(edits, reverse=True):
        if kind == "drop":
            del bad[pos:pos + k]
        else:
            bad[pos:pos] = rng.integers(0, 256, k, dtype=np.uint8).tobytes()
    return bytes(bad)


def ps3_frame(t: int, levels: list[int], marker: bool = False) -> bytes:
    """One PowerSensor3 frame, built bit by bit from the PROTOCOLS.md description."""
    out = [0xF0 | ((t >> 6) & 0xF), 0x40 | (t & 0x3F)]
    for i, lv in enumerate(levels):
        out += [0x80 | (i << 4) | (lv >> 6), (0x40 if marker and i == 0 else 0) | (lv & 0x3F)]
    return bytes(out)


def ps3_stream(n: int, t0: int = 0, step: int = 50, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(ps3_frame((t0 + k * step) & 0x3FF, rng.integers(0, 1024, 8).tolist())
                    for k in range(n))
