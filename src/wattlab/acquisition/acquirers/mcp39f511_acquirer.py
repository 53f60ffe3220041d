"""The MCP39F511N demo board as a source: every output update once, energy from its counters.

The chip computes its outputs over an accumulation interval of 2^N line cycles and writes
them all at its end; nothing on the wire says an update happened. So the source reads the
output block about when the next update is due (one interval after the read that found
the last one, less an eighth so a drifting schedule is pulled back), and, when the bytes
are unchanged, reads again an eighth of an interval later: each update is found within an
eighth of an interval and kept once. N = 1 (2 line cycles: 40 ms at 50 Hz, 33 ms at 60 Hz)
is the fastest useful rate and the default; the N found is restored at close. An update
that went unread (a host stall) leaves a Gap with the count of lost updates, but no energy
is lost: the chip's import/export accumulators are read with every update, so
``energy_import{1,2}_j`` differenced over any span is that span's energy, gaps included.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading, sleep_until_due
from wattlab.acquisition.acquirers.meter_registry import (
    MeterKind,
    StreamRate,
    input_rails,
    needs_rails,
    register,
)
from wattlab.acquisition.acquirers.serial_acquirer import SerialAcquirer
from wattlab.drivers.mcp39f511 import (
    DEFAULT_ENERGY_UNIT_J,
    ENERGY_ENABLE,
    MAX_N,
    MIN_USEFUL_N,
    Mcp39f511,
    Outputs,
    Powers,
    identify,
)
from wattlab.drivers.transport import ByteTransport, open_serial
from wattlab.errors import MeterError, MeterProtocolError, MeterTimeoutError, UsageError
from wattlab.option_checks import int_range, positive_number, rail_table
from wattlab.samples import Channel, Gap, SourceDescriptor

POLL_STEP_S = 0.1
RETRIES = 2  # extra tries of a transaction answered with NAK, a bad checksum, or too little
MAX_FAILED_POLLS = 10
MISSED_FACTOR = 1.5
ENERGY_CHECK_MIN_S = 5.0
ENERGY_CHECK_TOLERANCE = 0.1
# per outlet c: device channel f"{stem}{c}{tail}", renamed by a rail to f"{rail}_{stem}{tail}"
CHANNELS_PER_INPUT = (("current", "_a", "A", "RMS current"),
                      ("power", "_w", "W", "active power"),
                      ("reactive", "_var", "var", "reactive power"),
                      ("apparent", "_va", "VA", "apparent power"),
                      ("power_factor", "", "1", "power factor"),
                      ("energy_import", "_j", "J", "import active energy since the stream "
                                                  "opened, from the chip's accumulator"),
                      ("energy_export", "_j", "J", "export active energy since the stream "
                                                  "opened, from the chip's accumulator"))
INPUTS = ("1", "2")
READ_TIMEOUT_S = 0.05  # a 35-byte reply takes 3 ms at 115 200 baud: a cut reply shows soon


def open_port(port: str) -> ByteTransport:
    """The shared serial opener, with a timeout short against the 33-40 ms interval."""
    return open_serial(port, timeout_s=READ_TIMEOUT_S)


def rail_renames(c: str) -> tuple[tuple[str, str], ...]:
    """(device channel, rail suffix) of one outlet: what a bench rail on it renames."""
    return tuple((f"{stem}{c}{tail}", f"{stem}{tail}") for stem, tail, _, _ in CHANNELS_PER_INPUT)


def stream_channels() -> list[Channel]:
    out = [Channel("voltage_v", "V", "RMS line voltage"),
           Channel("frequency_hz", "Hz", "line frequency")]
    for c in INPUTS:
        out += [Channel(f"{stem}{c}{tail}", unit, f"outlet {c} {meaning}")
                for stem, tail, unit, meaning in CHANNELS_PER_INPUT]
    out.append(Channel("power_total_w", "W", "active power of both outlets"))
    return out


class Mcp39f511Acquirer(SerialAcquirer[Mcp39f511]):
    """Acquirer protocol over one MCP39F511N demo board (115 200 8N1)."""

    def __init__(self, port: str, source_id: str = "mcp", *,
                 accumulation_n: int = MIN_USEFUL_N,
                 energy_unit_j: float = DEFAULT_ENERGY_UNIT_J,
                 transport_factory: Callable[[str], ByteTransport] = open_port) -> None:
        if not 0 <= accumulation_n <= MAX_N:
            raise UsageError(f"{port}: accumulation_n {accumulation_n} outside 0..{MAX_N}")
        if not energy_unit_j > 0:
            raise UsageError(f"{port}: energy_unit_j must be > 0, got {energy_unit_j}")
        super().__init__(port, source_id, transport_factory)
        self.accumulation_n = accumulation_n
        self.energy_unit_j = energy_unit_j
        self._restore: tuple[int, int] | None = None  # (N, system configuration) found
        self.interval_s = 0.0
        self.retries = 0
        self.updates_lost = 0
        self._failed_polls = 0
        self._last_raw = b""
        self._last_ns: int | None = None
        self._due_ns = 0
        self._counts0 = (0, 0, 0, 0)
        self._counts = (0, 0, 0, 0)
        self._power_j = 0.0  # Σ active power × interval over the updates read
        self._seconds = 0.0  # intervals read, in seconds

    def _try(self, call: Callable[[], Any]) -> Any:
        """One transaction, tried again after a NAK, a bad checksum or a short reply."""
        for attempt in range(RETRIES + 1):
            try:
                return call()
            except (MeterProtocolError, MeterTimeoutError):
                if attempt == RETRIES:
                    raise
                self.retries += 1
        raise AssertionError("unreachable")

    def open(self) -> list[SourceDescriptor]:
        """Set N and switch accumulation on (both restored at close), then describe."""
        self.driver = d = Mcp39f511(self._open_port(), name=self.port)
        version = self._try(d.system_version)
        found_n, config = self._try(d.accumulation_n), self._try(d.system_config)
        self._restore = (found_n, config)
        if found_n != self.accumulation_n:
            self._try(lambda: d.set_accumulation_n(self.accumulation_n))
        if config & ENERGY_ENABLE != ENERGY_ENABLE:
            self._try(lambda: d.set_system_config(config | ENERGY_ENABLE))
        first: Outputs = self._try(d.read_outputs)
        line_hz = first.frequency_hz if 40.0 < first.frequency_hz < 70.0 else 50.0
        self.interval_s = (1 << self.accumulation_n) / line_hz
        self._last_raw = first.raw  # may predate the new N: the first update kept is the next
        _, self._counts0 = self._read_rest(first.status)
        self._counts = self._counts0
        self._due_ns = time.monotonic_ns()
        return [SourceDescriptor(
            source_id=self.source_id, kind="mcp39f511", model="Microchip MCP39F511N",
            channels=tuple(stream_channels()), firmware=f"0x{version:04X}",
            transport=f"serial:{self.port}@115200", value_dtype="<f8",
            config={"accumulation_n": self.accumulation_n, "line_hz": line_hz,
                    "update_interval_s": self.interval_s,
                    "accumulation_n_found": found_n, "energy_unit_j": self.energy_unit_j,
                    "capture": "one sample per output update; energy channels from the "
                               "chip's accumulators, exact across unread updates",
                    "power_channel": "power_total_w"})]

    def _read_rest(self, status: int) -> tuple[Powers, tuple[int, int, int, int]]:
        """The update's other powers, and import 1, 2 and export 1, 2 accumulator counts."""
        assert self.driver is not None
        d = self.driver
        powers: Powers = self._try(lambda: d.read_powers(status))
        export = self._try(d.read_export)
        return powers, (*powers.import_counts, *export)

    def poll(self) -> list[Reading]:
        """Read the outputs when an update is due; keep each update once."""
        if self.driver is None:
            raise MeterError(f"{self.port}: poll before open")
        if not sleep_until_due(self._due_ns, POLL_STEP_S):
            return []
        t0 = time.monotonic_ns()
        interval_ns = int(self.interval_s * 1e9)
        try:
            outputs: Outputs = self._try(self.driver.read_outputs)
            if outputs.raw == self._last_raw:  # not yet: look again an eighth later
                self._due_ns = t0 + interval_ns // 8
                self._failed_polls = 0
                return []
            powers, counts = self._read_rest(outputs.status)
        except (MeterProtocolError, MeterTimeoutError) as e:
            self._failed_polls += 1
            if self._failed_polls >= MAX_FAILED_POLLS:
                raise MeterError(f"{self.port}: {MAX_FAILED_POLLS} polls failed in a row: "
                                 f"{e}") from e
            self._due_ns = time.monotonic_ns() + interval_ns // 8
            return [Gap(self.source_id, f"read failed: {e}"[:128], t_first_ns=t0)]
        t1 = time.monotonic_ns()
        self._failed_polls = 0
        self._last_raw = outputs.raw
        self._due_ns = t0 + interval_ns - interval_ns // 8
        return [*self._missed(t0), self._chunk((t0 + t1) // 2, outputs, powers, counts)]

    def _missed(self, t_ns: int) -> list[Reading]:
        last, self._last_ns = self._last_ns, t_ns
        if last is None or t_ns - last <= MISSED_FACTOR * self.interval_s * 1e9:
            return []
        lost = round((t_ns - last) / (self.interval_s * 1e9)) - 1
        self.updates_lost += lost
        return [Gap(self.source_id, "chip updates not read in time (energy counters "
                    "bridge them)", t_first_ns=last, t_last_ns=t_ns, samples_lost=lost)]

    def _chunk(self, t_ns: int, o: Outputs, p: Powers, counts: tuple[int, int, int, int]
               ) -> Chunk:
        self._counts = counts
        self._power_j += sum(o.active_w) * self.interval_s
        self._seconds += self.interval_s
        energy = [(counts[k] - self._counts0[k]) * self.energy_unit_j for k in range(4)]
        row: list[float] = [o.voltage_v, o.frequency_hz]
        for ch in range(2):
            row += [o.current_a[ch], o.active_w[ch], p.reactive_var[ch], p.apparent_va[ch],
                    o.power_factor[ch], energy[ch], energy[2 + ch]]
        row.append(sum(o.active_w))
        return Chunk(self.source_id, np.array([t_ns], dtype=np.int64),
                     np.array([row], dtype=np.float64), flags=np.zeros(1, dtype=np.uint8))

    def energy_check(self) -> str | None:
        """A warning when the counters and the integrated power disagree (wrong unit?)."""
        delta = [(self._counts[k] - self._counts0[k]) * self.energy_unit_j for k in range(4)]
        counted = delta[0] + delta[1] - delta[2] - delta[3]
        if self.updates_lost or self._seconds < ENERGY_CHECK_MIN_S or not self._power_j:
            return None
        ratio = counted / self._power_j
        if abs(ratio - 1) <= ENERGY_CHECK_TOLERANCE:
            return None
        return (f"{self.port}: the energy counters give {counted:.1f} J but the power "
                f"integrates to {self._power_j:.1f} J (×{ratio:.3f}): is energy_unit_j "
                f"({self.energy_unit_j} J per count) right for this board?")

    def flush(self) -> list[Reading]:
        """Nothing is held back; says so on stderr if the energy unit looks wrong."""
        warning = self.energy_check()
        if warning:
            print(f"wattlab: {warning}", file=sys.stderr)
        return []

    def _farewell(self) -> None:
        """Put N and the accumulation setting back as found."""
        if self.driver is not None and self._restore is not None:
            n, config = self._restore
            if n != self.accumulation_n:
                self.driver.set_accumulation_n(n)
            if config & ENERGY_ENABLE != ENERGY_ENABLE:
                self.driver.set_system_config(config)


def _build(address: str, source_id: str, options: Mapping[str, Any]) -> Mcp39f511Acquirer:
    return Mcp39f511Acquirer(address, source_id,
                             accumulation_n=int(options.get("accumulation_n", MIN_USEFUL_N)),
                             energy_unit_j=float(options.get("energy_unit_j",
                                                             DEFAULT_ENERGY_UNIT_J)))


def _emulate(power_w: Callable[[Any], Any], seed: int, name: str) -> int:
    from wattlab.hardware.emulators.mcp39f511_emulator import run_emulator_cli

    return run_emulator_cli(power_w, seed=seed)


KIND = register(MeterKind(
    kind="mcp39f511", default_id="mcp", aliases=("mcp39f511n", "mcp"),
    help="Microchip MCP39F511N power-monitor demo board (two AC outlets) on USB serial",
    build=_build,
    stream_rate=StreamRate(30.0, 100),  # an update every 33-40 ms (2 line cycles)
    options={"rails": (rail_table(list(INPUTS), "outlet"), None),
             "accumulation_n": (int_range(0, MAX_N), MIN_USEFUL_N),
             "energy_unit_j": (positive_number, DEFAULT_ENERGY_UNIT_J)},
    rails_of=input_rails(lambda c: f"outlet {c}", rail_renames, lambda c: f"power{c}_w"),
    board_problem=needs_rails("1"),
    usb_ids=((0x04D8, 0x00DD),),  # the board's MCP2221 USB-UART bridge
    identify=identify, emulate=_emulate, emulate_as=("mcp39f511",),
    template="""
# Microchip MCP39F511N demo board: two AC outlets (USB serial, /dev/ttyACM* on Linux).
# rails: outlet (1, 2) = rail. accumulation_n: outputs every 2^N line cycles (1 = 40 ms
# at 50 Hz, the fastest useful). energy_unit_j: joules per accumulator count.
# [[device]]
# kind = "mcp39f511"
# id = "mcp"
# port = "/dev/ttyACM0"
# rails = { 1 = "server_ac" }
# accumulation_n = 1
""",
))
