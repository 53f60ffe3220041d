"""What the PMD and PowerSensor3 decoders output on the corpus, kept as the reference.

Why: issue 36 item 7 rewrote both decoders for speed; their output had to stay what it
was. ``tests/data/decoders/reference.json`` was written by the decoders before that change
(commit "decoder corpus and reference"); ``tests/test_decoder_corpus.py`` compares today's
output with it. Regenerate only for a change of behaviour made on purpose, and say why:

    python -m tests.decoder_reference
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tests.decoder_corpus import PMD_CONFIGS, Case, garbage, pmd_valid, ps3_valid
from wattlab.drivers.pmd import ContinuousDecoder
from wattlab.drivers.powersensor3 import FrameDecoder

REFERENCE = Path(__file__).resolve().parent / "data" / "decoders" / "reference.json"
READ_BYTES = 1000  # the second feeding: reads of this size (the first: one read)


def reads(data: bytes, size: int | None) -> list[bytes]:
    if size is None:
        return [data]
    return [data[i:i + size] for i in range(0, len(data), size)]


def _digest(*arrays: Any) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(repr(a).encode() if not isinstance(a, np.ndarray) else a.tobytes())
    return h.hexdigest()[:24]


def skip_events(outs: list[Any]) -> list[tuple[int, Any]]:
    """Each read's skip events, their frame indices counted over the whole stream (a read's
    own indices start at 0)."""
    events, base = [], 0
    for o in outs:
        events += [(i + base, k) for i, k in o.skip_events]
        base += o.n
    return events


def pmd_output(mask: int, ts_bytes: int, data: bytes, size: int | None) -> dict[str, Any]:
    """Every feed's frames, then flush's, joined: counts and a digest of every field."""
    dec = ContinuousDecoder(mask, ts_bytes)
    outs = [dec.feed(x) for x in reads(data, size)] + [dec.flush()]
    events = skip_events(outs)
    ts = np.concatenate([o.ts_raw for o in outs]).astype("<i8")
    words = np.concatenate([o.words for o in outs]).astype("<u2")
    resync = np.concatenate([o.resync for o in outs]).astype("u1")
    ticks = (None if outs[0].ticks is None
             else np.concatenate([o.ticks for o in outs if o.ticks is not None]).astype("<i8"))
    skipped = sum(o.skipped_bytes for o in outs)
    return {"frames": int(words.shape[0]), "skipped": skipped, "pending": dec.pending_bytes,
            "digest": _digest(ts, words, resync, ticks, events, dec.period_ticks,
                              dec.nibble_rule)}


def ps3_output(stop: bool, data: bytes, size: int | None) -> dict[str, Any]:
    dec = FrameDecoder(stop_on_terminator=stop)
    outs = [dec.feed(x) for x in reads(data, size)]
    events = skip_events(outs)
    levels = np.concatenate([o.levels for o in outs]).astype("<u2")
    marker = np.concatenate([o.marker for o in outs]).astype("u1")
    t = np.concatenate([o.device_t_us for o in outs]).astype("<u2")
    resync = np.concatenate([o.resync for o in outs]).astype("u1")
    stopped = [o.stopped for o in outs]
    return {"frames": int(t.shape[0]), "skipped": sum(o.skipped_bytes for o in outs),
            "pending": dec.pending_bytes, "ignored": dec.ignored_bytes,
            "digest": _digest(levels, marker, t, resync, events, stopped)}


def pmd_cases(mask: int, ts_bytes: int) -> Iterator[Case]:
    yield from garbage()
    yield from pmd_valid(mask, ts_bytes)


def ps3_cases() -> Iterator[Case]:
    yield from garbage()
    yield from ps3_valid()


def outputs() -> dict[str, dict[str, Any]]:
    """Keyed by decoder setting, then ``case/feeding``."""
    out: dict[str, dict[str, Any]] = {}
    for mask, ts_bytes in PMD_CONFIGS:
        out[f"pmd mask=0x{mask:02x} ts={ts_bytes}"] = {
            f"{c.name}/{name}": pmd_output(mask, ts_bytes, c.data, size)
            for c in pmd_cases(mask, ts_bytes) for name, size in FEEDINGS}
    for stop in (False, True):
        out[f"ps3 stop={stop}"] = {f"{c.name}/{name}": ps3_output(stop, c.data, size)
                                   for c in ps3_cases() for name, size in FEEDINGS}
    return out


FEEDINGS = (("whole", None), (f"reads{READ_BYTES}", READ_BYTES))


def main() -> int:
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{json.dumps(setting)}: {{" + ",".join(
        f"\n  {json.dumps(case)}: {json.dumps(out, sort_keys=True)}"
        for case, out in sorted(cases.items())) + "}" for setting, cases in outputs().items()]
    REFERENCE.write_text("{" + ",\n".join(lines) + "}\n")
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
