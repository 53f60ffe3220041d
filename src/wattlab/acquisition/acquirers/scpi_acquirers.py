"""Acquirers for SCPI power analysers at the wall: Yokogawa WT300E and R&S HMC8015.

The WT300E tells us when it has new data (event register latch + ``:COMM:WAIT``), so
every instrument update is captured exactly once, stamped when the wait returns; the
register is read again after the values, so an update that lands during the read (a host
stall) is neither read twice nor lost unnoticed. Between
updates ``poll`` sleeps in short steps and only issues the blocking wait shortly before
the next update is due, so it never blocks much longer than ~0.1 s at any rate. The
HMC8015 offers no such event, so its reads are host-paced and an unchanged vector is
flagged REPEAT.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading, sleep_until_due
from wattlab.acquisition.acquirers.meter_registry import MeterKind, Rail, StreamRate, register
from wattlab.drivers.hmc8015 import Hmc8015
from wattlab.drivers.scpi import ScpiTransport, TextTransport
from wattlab.drivers.yokogawa_wt300e import Wt300e
from wattlab.errors import UsageError
from wattlab.option_checks import (
    bool_check,
    positive_number,
    rail_name,
    rail_table,
    string,
    string_list,
)
from wattlab.samples import Channel, Gap, SampleFlag, SourceDescriptor, check_source_id

POLL_STEP_S = 0.1
WAIT_LEAD_S = 0.1
MISSED_FACTOR = 1.5


def _flags_of(value_flags: np.ndarray[Any, Any]) -> int:
    return int(np.bitwise_or.reduce(value_flags)) if value_flags.size else 0


class Wt300eAcquirer:
    """A Yokogawa WT300E as a source: one sample per instrument update."""

    def __init__(
        self,
        resource: str,
        source_id: str = "wall",
        elements: Sequence[int | str] = (1,),
        items: Sequence[str] = ("U", "I", "P"),
        rate_s: float = 0.1,
        *,
        resource_manager: Any = None,
        model: str | None = None,
        transport: TextTransport | None = None,
    ) -> None:
        self.resource = resource
        self.source_id = check_source_id(source_id)
        self.elements = tuple(elements)
        self.items = tuple(items)
        self.rate_s = rate_s
        self.model = model
        if not self.elements or not self.items:
            raise UsageError(f"{resource}: give at least one element and one item")
        self._rm = resource_manager
        self._transport = transport
        self._driver: Wt300e | None = None
        self._channels: list[Channel] = []
        self._last_ns: int | None = None
        self._expected_ns: int | None = None

    def open(self) -> list[SourceDescriptor]:
        """Connect, configure rate and items, and arm the update latch."""
        transport = self._transport or ScpiTransport(
            self.resource, self._rm, timeout_ms=int(self.rate_s * 1000) + 2000
        )
        self._driver = driver = Wt300e(transport, self.model)
        identity = driver.connect()
        driver.update_rate_s = self.rate_s
        self._channels = driver.select_items(
            [(fn, el) for el in self.elements for fn in self.items]
        )
        driver.clear_update_event()
        return [
            SourceDescriptor(
                source_id=self.source_id,
                kind="power_analyser",
                model=identity.model,
                channels=tuple(self._channels),
                serial=identity.serial,
                firmware=identity.firmware,
                transport=self.resource,
                config={
                    "manufacturer": identity.manufacturer,
                    "rate_s": self.rate_s,
                    "items": [f"{code},{el}" for code, el in driver.items],
                    "elements": [str(e) for e in self.elements],
                    "capture": "one sample per update (:STAT:FILT1 FALL, :COMM:WAIT 1)",
                },
            )
        ]

    def poll(self) -> list[Reading]:
        """Wait for (at most) one update and return it; sleeps while none can be due."""
        if self._driver is None:
            raise UsageError(f"{self.resource}: open() before poll()")
        if self._expected_ns is not None:
            early_s = (self._expected_ns - time.monotonic_ns()) / 1e9 - WAIT_LEAD_S
            if early_s > 0:
                time.sleep(min(early_s, POLL_STEP_S))
                return []
        driver = self._driver
        if not driver.wait_update():
            return []
        t_ns = time.monotonic_ns()
        values, value_flags = driver.read_values()
        readings: list[Reading] = []
        if driver.take_update_event():
            # The next update landed while we read (the host stalled for a whole update):
            # the values may be the newer update's, and its event is now consumed. A second
            # read tells. Other values: both updates are kept. The same: they were the newer
            # one's, and the update the wait announced was never read (a Gap of one).
            again_ns = time.monotonic_ns()
            again, again_flags = driver.read_values()
            if np.array_equal(values, again, equal_nan=True):
                readings += self._missed(t_ns)
                readings.append(Gap(self.source_id, "instrument update replaced while read",
                                    t_first_ns=t_ns, t_last_ns=again_ns, samples_lost=1))
                self._last_ns = t_ns
            else:
                readings += self._reading(t_ns, values, value_flags)
            t_ns, values, value_flags = again_ns, again, again_flags
        return readings + self._reading(t_ns, values, value_flags)

    def _missed(self, t_ns: int) -> list[Reading]:
        """A Gap if updates went unread between the last one read and ``t_ns``."""
        rate_ns = int(self.rate_s * 1e9)
        if self._last_ns is None or t_ns - self._last_ns <= MISSED_FACTOR * rate_ns:
            return []
        lost = round((t_ns - self._last_ns) / rate_ns) - 1
        return [Gap(self.source_id, "instrument updates not read in time",
                    t_first_ns=self._last_ns, t_last_ns=t_ns, samples_lost=lost)]

    def _reading(self, t_ns: int, values: np.ndarray[Any, Any],
                 value_flags: np.ndarray[Any, Any]) -> list[Reading]:
        """One update as a Chunk, after a Gap if updates went unread since the last one."""
        readings = self._missed(t_ns)
        self._last_ns = t_ns
        self._expected_ns = t_ns + int(self.rate_s * 1e9)
        readings.append(
            Chunk(
                self.source_id,
                np.array([t_ns], dtype=np.int64),
                values.reshape(1, -1),
                flags=np.array([_flags_of(value_flags)], dtype=np.uint8),
            )
        )
        return readings

    def close(self) -> None:
        """Release the instrument (integration and settings are left as they are)."""
        if self._driver is not None:
            self._driver.close()
            self._driver = None


class Hmc8015Acquirer:
    """An R&S HMC8015 as a source: host-paced reads every ``rate_s``."""

    def __init__(
        self,
        resource: str,
        source_id: str = "wall",
        functions: Sequence[str] = ("URMS", "IRMS", "P"),
        rate_s: float = 0.1,
        *,
        resource_manager: Any = None,
        auto_range: bool = True,
        transport: TextTransport | None = None,
    ) -> None:
        if not rate_s > 0:
            raise UsageError(f"{resource}: rate {rate_s} s must be positive")
        self.resource = resource
        self.source_id = check_source_id(source_id)
        self.functions = tuple(functions)
        self.rate_s = rate_s
        self.auto_range = auto_range
        self._rm = resource_manager
        self._transport = transport
        self._driver: Hmc8015 | None = None
        self._due_ns = 0
        self._previous: bytes | None = None

    def open(self) -> list[SourceDescriptor]:
        """Connect, set ranging and functions."""
        transport = self._transport or ScpiTransport(self.resource, self._rm)
        self._driver = driver = Hmc8015(transport)
        identity = driver.connect()
        if self.auto_range:
            driver.auto_range()
        channels = driver.set_functions(self.functions)
        self._due_ns = time.monotonic_ns()
        return [
            SourceDescriptor(
                source_id=self.source_id,
                kind="power_analyser",
                model=identity.model,
                channels=tuple(channels),
                serial=identity.serial,
                firmware=identity.firmware,
                transport=self.resource,
                config={
                    "manufacturer": identity.manufacturer,
                    "rate_s": self.rate_s,
                    "functions": list(driver.functions),
                    "auto_range": self.auto_range,
                    "capture": "host-paced; unchanged readings flagged repeat",
                },
            )
        ]

    def poll(self) -> list[Reading]:
        """Read once when due; otherwise sleep at most ~0.1 s."""
        if self._driver is None:
            raise UsageError(f"{self.resource}: open() before poll()")
        if not sleep_until_due(self._due_ns, POLL_STEP_S):
            return []
        t0 = time.monotonic_ns()
        values, value_flags = self._driver.read_values()
        t1 = time.monotonic_ns()
        rate_ns = int(self.rate_s * 1e9)
        self._due_ns += rate_ns
        if self._due_ns < t1:  # fell behind: restart the schedule, never burst
            self._due_ns = t1 + rate_ns
        flag = _flags_of(value_flags)
        key = values.tobytes()
        if key == self._previous:
            flag |= int(SampleFlag.REPEAT)
        self._previous = key
        return [
            Chunk(
                self.source_id,
                np.array([(t0 + t1) // 2], dtype=np.int64),
                values.reshape(1, -1),
                flags=np.array([flag], dtype=np.uint8),
            )
        ]

    def close(self) -> None:
        """Release the instrument."""
        if self._driver is not None:
            self._driver.close()
            self._driver = None


# ----------------------------------------------------------------------------- registration

WT_ELEMENTS = ["1", "2", "3", "SIGMA"]


def element_key(key: Any) -> int | str:
    """A WT300E element as the driver takes it: 1, 2, 3 or "SIGMA" (TOML keys are text)."""
    text = str(key).strip()
    return int(text) if text.isascii() and text.isdigit() else text.upper()


def _elements(value: Any) -> str | None:
    if isinstance(value, dict):
        return rail_table(WT_ELEMENTS, "element")(value)
    ok = isinstance(value, list) and value and all(
        (isinstance(v, int) and not isinstance(v, bool) and v >= 1) or v == "SIGMA"
        for v in value)
    return None if ok else ("must be a list of element numbers like [1, 2] (or \"SIGMA\"), "
                            "or a table naming what each measures: { 1 = \"wall\" }")


def _wt300e_rails(options: Mapping[str, Any]) -> list[Rail]:
    """A table of elements names them: each element's items become ``<name>_<quantity>``."""
    from wattlab.drivers.yokogawa_wt300e import FUNCTIONS, item_channels, normalise_function

    labels = options.get("elements")
    if not isinstance(labels, Mapping):
        return []
    elements = [element_key(e) for e in labels]
    codes = [normalise_function(f) for f in options.get("items", ("U", "I", "P"))]
    items = [(code, el) for el in elements for code in codes]
    device = [c.name for c in item_channels(items)]
    rails = []
    for key, name in labels.items():
        el = element_key(key)
        picked = [(device[k], f"{name}_{FUNCTIONS[code].channel}")
                  for k, (code, e) in enumerate(items) if e == el]
        power = [device[k] for k, (code, e) in enumerate(items) if e == el and code == "P"]
        rails.append(Rail(str(name), f"element {el}", tuple(picked),
                          power[0] if power else None))
    return rails


def _wt300e_board(options: Mapping[str, Any]) -> str | None:
    if not isinstance(options["elements"], dict):
        return 'needs elements = { 1 = "..." } naming what each element measures'
    has_p = any(i.strip().upper() == "P" for i in options["items"])
    return None if has_p else 'needs "P" (active power) in items'


def _hmc8015_rails(options: Mapping[str, Any]) -> list[Rail]:
    """``rail = "name"`` names the one input: its functions become ``<name>_<quantity>``."""
    from wattlab.drivers.hmc8015 import FUNCTIONS as HMC
    from wattlab.drivers.hmc8015 import function_code

    if not options.get("rail"):
        return []
    name = str(options["rail"])
    codes = [function_code(f) for f in options.get("functions", ("URMS", "IRMS", "P"))]
    return [Rail(name, "input", tuple((HMC[c].channel, f"{name}_{HMC[c].channel}")
                                      for c in codes),
                 HMC["P"].channel if "P" in codes else None)]


def _hmc8015_board(options: Mapping[str, Any]) -> str | None:
    if "rail" not in options:
        return 'needs rail = "..." naming what the HMC8015 measures'
    has_p = any(f.strip().upper() == "P" for f in options["functions"])
    return None if has_p else 'needs "P" (active power) in functions'


def _build_wt300e(address: str, source_id: str, options: Mapping[str, Any]) -> Wt300eAcquirer:
    return Wt300eAcquirer(address, source_id,
                          elements=[element_key(e) for e in options.get("elements", [1])],
                          items=options.get("items", ("U", "I", "P")),
                          rate_s=float(options.get("rate_s", 0.1)), model=options.get("model"))


def _build_hmc8015(address: str, source_id: str, options: Mapping[str, Any]
                   ) -> Hmc8015Acquirer:
    return Hmc8015Acquirer(address, source_id,
                           functions=options.get("functions", ("URMS", "IRMS", "P")),
                           rate_s=float(options.get("rate_s", 0.1)),
                           auto_range=bool(options.get("auto_range", True)))


def _emulate(power_w: Callable[[Any], Any], seed: int, name: str) -> int:
    from wattlab.hardware.emulators.scpi_server import run_emulator_cli

    return run_emulator_cli(name, power_w)


WT300E = register(MeterKind(
    kind="wt300e", default_id="wall", aliases=("wt310e", "wt332e", "wt333e"),
    help="Yokogawa WT300E series over VISA", build=_build_wt300e, address_key="resource",
    stream_rate=StreamRate(10.0, 41),
    options={"elements": (_elements, [1]), "items": (string_list, ["U", "I", "P"]),
             "rate_s": (positive_number, 0.1), "model": (string, None)},
    rails_of=_wt300e_rails, board_problem=_wt300e_board,
    emulate=_emulate, emulate_as=("wt310e", "wt332e", "wt333e"),
    template="""
# Yokogawa WT310E / WT332E / WT333E (VISA resource). elements: a list [1, 2], or a
# table naming what each element measures: { 1 = "wall" } gives wall_power_w, ...
# [[device]]
# kind = "wt300e"
# id = "wall"
# resource = "TCPIP::192.168.1.50::10001::SOCKET"
# elements = { 1 = "wall" }
# items = ["U", "I", "P"]
# rate_s = 0.1          # update interval: 0.1, 0.25, 0.5, 1, 2, 5 s
""",
))
HMC8015 = register(MeterKind(
    kind="hmc8015", default_id="hmc", help="Rohde & Schwarz HMC8015 over VISA",
    build=_build_hmc8015, address_key="resource", stream_rate=StreamRate(10.0, 41),
    options={"functions": (string_list, ["URMS", "IRMS", "P"]),
             "rate_s": (positive_number, 0.1), "auto_range": (bool_check, True),
             "rail": (rail_name, None)},
    rails_of=_hmc8015_rails, board_problem=_hmc8015_board,
    emulate=_emulate, emulate_as=("hmc8015",),
    template="""
# Rohde & Schwarz HMC8015 (VISA resource). rail: what its one input measures.
# [[device]]
# kind = "hmc8015"
# id = "hmc"
# resource = "TCPIP::192.168.1.51::5025::SOCKET"
# functions = ["URMS", "IRMS", "P"]
# rate_s = 0.1
# rail = "psu_ac"
""",
))
