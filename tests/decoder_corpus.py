"""The decoders' corpus (issue 36 item 7): faulty-device bytes and damaged valid streams.

Garbage, as a faulty device or a wrong baud rate sends it: random bytes; periodic patterns
of every period 1..64; a run of each byte value 0..255. Valid streams, clean and damaged
(bytes dropped, random bytes inserted, the stop terminator inside, garbage around), and the
cases property tests found (their ``@example`` pins). ``tests/test_decoder_corpus.py``
checks the decoders against ``tests/data/decoders/reference.json`` on it, and
``bench/decode.py`` times them on it, larger.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tests.decoder_streams import damage, pmd_stream, ps3_stream

# (channel mask, timestamp bytes): the default (8 channels, 4-byte ticks), the smallest
# frames with each kind of clock, and one rail with a short clock
PMD_CONFIGS = ((0xFF, 4), (0x03, 2), (0x03, 0), (0x01, 1))
PS3_STOP = b"\xff\x3f\xff\x3f"
GARBAGE_BYTES = 5000  # crosses the decoders' 4096-byte search window


@dataclass(frozen=True)
class Case:
    """One input; ``garbage``: no frame may come out of it where the frame can tell."""

    name: str
    data: bytes
    garbage: bool


def garbage(size: int = GARBAGE_BYTES, run_values: range = range(256)) -> Iterator[Case]:
    rng = np.random.default_rng(36)  # the patterns first: the same whatever the size
    patterns = [rng.integers(0, 256, period, dtype=np.uint8).tobytes() for period in range(1, 65)]
    yield Case("random", rng.integers(0, 256, size, dtype=np.uint8).tobytes(), True)
    for pattern in patterns:
        yield Case(f"period{len(pattern)}", (pattern * (size // len(pattern) + 1))[:size], True)
    for value in run_values:
        yield Case(f"run{value:02x}", bytes([value]) * size, True)


def _edits(rng: np.random.Generator, length: int, count: int) -> list[tuple[int, str, int]]:
    return [(int(rng.integers(0, length)), str(rng.choice(["drop", "insert"])),
             int(rng.integers(1, 46))) for _ in range(count)]


def pmd_valid(mask: int, ts_bytes: int, frames: int = 400) -> Iterator[Case]:
    """Clean and damaged PMD streams of ``mask``'s channels, and the pinned fuzz finds."""
    nch = bin(mask).count("1")
    clean = pmd_stream(frames, ts_bytes, nch=nch)[0]
    yield Case("clean", clean, False)
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, 300, dtype=np.uint8).tobytes()
    yield Case("garbage-around", noise + clean + noise, False)
    yield Case("periodic-between", clean[:1000] + b"\x5a\xa5\x00" * 100 + clean[1000:], False)
    for seed in range(24):
        edits = _edits(rng, len(clean), 1 + seed % 4)
        yield Case(f"damaged{seed}", damage(clean, edits, seed), False)
    if (mask, ts_bytes) == (0xFF, 4):  # test_pmd_decoder's @example pins
        for seed, drops in ((233, [(1154, 27)]), (40309, [(524, 4)])):
            data = pmd_stream(60, seed=seed)[0]
            yield Case(f"pinned-{seed}", damage(data, [(p, "drop", k) for p, k in drops],
                                                 seed), False)


def ps3_valid(frames: int = 400) -> Iterator[Case]:
    """Clean and damaged PowerSensor3 streams, one with the stop terminator inside."""
    clean = ps3_stream(frames, seed=5)
    yield Case("clean", clean, False)
    rng = np.random.default_rng(8)
    noise = rng.integers(0, 256, 300, dtype=np.uint8).tobytes()
    yield Case("garbage-around", noise + clean + noise, False)
    yield Case("runs-between", clean[:900] + b"\xf0" * 200 + b"\xff" * 200 + clean[900:], False)
    yield Case("stop-inside", clean[:3600] + PS3_STOP + clean[3600:], False)
    for seed in range(24):
        edits = _edits(rng, len(clean), 1 + seed % 4)
        yield Case(f"damaged{seed}", damage(clean, edits, seed), False)
