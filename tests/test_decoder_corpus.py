"""The PMD and PowerSensor3 decoders on the corpus: the reference's output, and no frame
made from garbage where a frame can tell (issue 36 item 7).

The reference was written by the decoders before they were rewritten for speed
(tests/decoder_reference.py); the rewrite must give every frame, skip count, skip event,
resync flag, learnt period and nibble rule it gave, fed whole or in 1,000-byte reads.
"""

from __future__ import annotations

import json

import pytest

from tests.decoder_corpus import PMD_CONFIGS, Case, garbage, pmd_valid, ps3_valid
from tests.decoder_reference import FEEDINGS, REFERENCE, pmd_output, ps3_output

pytestmark = pytest.mark.fast

REF = json.loads(REFERENCE.read_text())
# the corpus in parts, each well under a second
FAMILIES = {
    "random and periodic": lambda c: not c.name.startswith("run"),
    "runs 00-7f": lambda c: c.name.startswith("run") and int(c.name[3:], 16) < 0x80,
    "runs 80-ff": lambda c: c.name.startswith("run") and int(c.name[3:], 16) >= 0x80,
}
KINDS = (*FAMILIES, "valid")


def garbage_family(kind: str) -> list[Case]:
    return [c for c in garbage() if FAMILIES[kind](c)]


def _mismatches(ref: dict[str, dict[str, object]], got: dict[str, dict[str, object]]
                ) -> list[str]:
    return [f"{k}: expected {ref.get(k)}, got {v}" for k, v in got.items() if ref.get(k) != v]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("mask", "ts_bytes"), PMD_CONFIGS)
def test_pmd_decoder_gives_the_reference_output(mask: int, ts_bytes: int, kind: str) -> None:
    cases = pmd_valid(mask, ts_bytes) if kind == "valid" else garbage_family(kind)
    got = {f"{c.name}/{name}": pmd_output(mask, ts_bytes, c.data, size)
           for c in cases for name, size in FEEDINGS}
    assert _mismatches(REF[f"pmd mask=0x{mask:02x} ts={ts_bytes}"], got) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stop", [False, True])
def test_powersensor3_decoder_gives_the_reference_output(stop: bool, kind: str) -> None:
    cases = ps3_valid() if kind == "valid" else garbage_family(kind)
    got = {f"{c.name}/{name}": ps3_output(stop, c.data, size)
           for c in cases for name, size in FEEDINGS}
    assert _mismatches(REF[f"ps3 stop={stop}"], got) == []


@pytest.mark.parametrize("kind", FAMILIES)
def test_no_frame_from_garbage_where_the_frame_can_tell(kind: str) -> None:
    """PowerSensor3 frames carry fixed bits in every byte, PMD frames a 4-byte clock that
    must step evenly: no garbage case gives one. (With a 0-2 byte clock a PMD frame is only
    plausible values, and random bytes can be that: the reference shows it, for 2 bytes
    three frames out of 5,000 random bytes.)"""
    for c in garbage_family(kind):
        for stop in (False, True):
            assert ps3_output(stop, c.data, None)["frames"] == 0, (c.name, stop)
        assert pmd_output(0xFF, 4, c.data, None)["frames"] == 0, c.name
