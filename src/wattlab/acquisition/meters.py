"""External meters named on the command line: ``--meter [ID=]KIND:ADDRESS``.

KIND is ``powersensor3`` (alias ``ps3``), ``pmd``, ``wt300e`` (aliases ``wt310e``,
``wt332e``, ``wt333e``) or ``hmc8015``; ADDRESS is a serial port or a VISA resource
string (which contains colons itself, so only the first colon splits). ID names the
stream in the run file (default: the kind's usual name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from wattlab.acquisition.source import Acquirer
from wattlab.errors import UsageError
from wattlab.samples import check_source_id


def _powersensor3(address: str, source_id: str) -> Acquirer:
    from wattlab.acquisition.powersensor3_source import PowerSensor3Acquirer

    return PowerSensor3Acquirer(address, source_id)


def _pmd(address: str, source_id: str) -> Acquirer:
    from wattlab.acquisition.pmd_source import PmdAcquirer

    return PmdAcquirer(address, source_id)


def _wt300e(address: str, source_id: str) -> Acquirer:
    from wattlab.acquisition.scpi_sources import Wt300eAcquirer

    return Wt300eAcquirer(address, source_id)


def _hmc8015(address: str, source_id: str) -> Acquirer:
    from wattlab.acquisition.scpi_sources import Hmc8015Acquirer

    return Hmc8015Acquirer(address, source_id)


@dataclass(frozen=True)
class MeterKind:
    """How to build one kind of meter, and the stream id it gets by default."""

    default_id: str
    build: Callable[[str, str], Acquirer]


METER_KINDS: dict[str, MeterKind] = {
    "powersensor3": MeterKind("ps3", _powersensor3),
    "pmd": MeterKind("pmd", _pmd),
    "wt300e": MeterKind("wall", _wt300e),
    "hmc8015": MeterKind("hmc", _hmc8015),
}
ALIASES = {"ps3": "powersensor3", "wt310e": "wt300e", "wt332e": "wt300e", "wt333e": "wt300e"}


@dataclass(frozen=True)
class MeterSpec:
    """A parsed ``--meter`` argument."""

    source_id: str
    kind: str
    address: str

    def acquirer(self) -> Acquirer:
        return METER_KINDS[self.kind].build(self.address, self.source_id)


def parse_meter_spec(text: str) -> MeterSpec:
    """``[ID=]KIND:ADDRESS`` → MeterSpec, with an error that shows the expected shape."""
    source_id = ""
    rest = text
    if "=" in text.split(":", 1)[0]:
        source_id, rest = text.split("=", 1)
    kind, sep, address = rest.partition(":")
    kind = ALIASES.get(kind.lower(), kind.lower())
    if not sep or not address:
        raise UsageError(f"--meter {text!r}: expected [ID=]KIND:ADDRESS, "
                         f"e.g. powersensor3:/dev/ttyACM0")
    if kind not in METER_KINDS:
        raise UsageError(f"--meter {text!r}: unknown meter kind {kind!r}; "
                         f"known: {', '.join(sorted([*METER_KINDS, *ALIASES]))}")
    return MeterSpec(check_source_id(source_id or METER_KINDS[kind].default_id), kind, address)


def meter_acquirers(specs: list[str]) -> list[tuple[str, Acquirer]]:
    """Acquirers for every ``--meter``; stream ids must be unique."""
    parsed = [parse_meter_spec(s) for s in specs]
    ids = [p.source_id for p in parsed]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise UsageError(f"--meter: stream id(s) {duplicates} used twice; name them ID=KIND:...")
    return [(p.source_id, p.acquirer()) for p in parsed]
