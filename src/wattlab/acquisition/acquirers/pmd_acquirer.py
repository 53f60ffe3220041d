"""ElmorLabs PMD-USB as an acquirer: open at 115 200 8N1, read the config, stream frames.

Raw time is the device's 3 MHz tick counter unwrapped (``device_ticks_3mhz``); host times
come from the driver's device → host mapping, so per-sample times carry the device's
spacing instead of the host's read jitter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading
from wattlab.acquisition.acquirers.meter_registry import (
    MeterKind,
    StreamRate,
    input_rails,
    needs_rails,
    register,
)
from wattlab.acquisition.acquirers.serial_acquirer import SerialAcquirer
from wattlab.drivers.pmd import BAUD_SETTLE_S, RAILS, PmdUsb, StreamBlock, stream_channels
from wattlab.drivers.transport import ByteTransport, open_serial
from wattlab.errors import MeterError
from wattlab.option_checks import positive_int, rail_table
from wattlab.samples import Gap, SourceDescriptor

POLL_COLLECT_S = 0.05
RAIL_SUFFIXES = ("voltage_v", "current_a", "power_w")  # the PMD's channels per rail


class PmdAcquirer(SerialAcquirer[PmdUsb]):
    """Acquirer protocol over one PMD-USB in continuous mode.

    The default port is 115 200 8N1 with a 0.1 s timeout; pyserial asserts RTS and DTR
    when it opens a port (as the official app does) and ignores them on a pty.
    """

    def __init__(self, port: str, source_id: str = "pmd", *, baud: int | None = None,
                 mask: int = 0xFF, ts_bytes: int = 4,
                 transport_factory: Callable[[str], ByteTransport] = open_serial,
                 baud_settle_s: float = BAUD_SETTLE_S) -> None:
        super().__init__(port, source_id, transport_factory)
        self.baud = baud
        self.mask = mask
        self.ts_bytes = ts_bytes
        self.baud_settle_s = baud_settle_s
        self.bytes_skipped = 0

    def open(self) -> list[SourceDescriptor]:
        """Identify, read firmware and config (CRC checked), set baud, start streaming."""
        channels = tuple(stream_channels(self.mask))  # bad masks fail before the port opens
        self.driver = PmdUsb(self._open_port(), name=self.port)
        info = self.driver.connect()
        if self.baud is not None and self.baud != self.driver.baud:
            self.driver.set_baudrate(self.baud, settle_s=self.baud_settle_s)
        desc = SourceDescriptor(
            source_id=self.source_id,
            kind="pmd-usb",
            model="ElmorLabs PMD-USB",
            channels=channels,
            firmware=str(info.product.firmware),
            transport=f"serial:{self.port}@{self.driver.baud}",
            value_dtype="<f4",
            time_raw="device_ticks_3mhz",
            config={
                "mask": self.mask,
                "ts_bytes": self.ts_bytes,
                "baud": self.driver.baud,
                "device_config": info.config.to_json(),
                "time_raw_note": "3 MHz device tick counter unwrapped by the host"
                                 if self.ts_bytes >= 2 else
                                 "no device clock (ts_bytes < 2): host time × 3 MHz, estimated",
            },
        )
        self.driver.start_continuous(self.mask, self.ts_bytes)
        return [desc]

    def poll(self) -> list[Reading]:
        """Read ~50 ms of stream and turn it into a chunk and resync gaps."""
        if self.driver is None:
            raise MeterError(f"{self.port}: poll before open")
        return self._readings(self.driver.read_stream(min_duration_s=POLL_COLLECT_S))

    def _readings(self, block: StreamBlock) -> list[Reading]:
        out: list[Reading] = []
        if block.n:
            out.append(Chunk(self.source_id, block.t_host_ns, block.values, block.ticks,
                             block.flags))
        for i, nbytes in block.skip_events:
            self.bytes_skipped += nbytes
            before = int(block.t_host_ns[i - 1]) if 0 < i <= block.n else -1
            after = int(block.t_host_ns[i]) if i < block.n else -1
            out.append(Gap(self.source_id, f"resync: {nbytes} bytes skipped",
                           t_first_ns=before, t_last_ns=after))
        return out

    def flush(self) -> list[Reading]:
        """The last frame, held back by the decoder until its successor came (none will)."""
        if self.driver is None or self.driver.decoder is None:
            return []
        return self._readings(self.driver.flush_stream())

    def _farewell(self) -> None:
        """Stop continuous mode (``07 00 …``)."""
        if self.driver is not None and self.driver.streaming:
            self.driver.stop_continuous()


def _build(address: str, source_id: str, options: Mapping[str, Any]) -> PmdAcquirer:
    baud = options.get("baud")
    return PmdAcquirer(address, source_id, baud=None if baud is None else int(baud))


def _identify(transport: ByteTransport) -> str:
    return str(PmdUsb(transport).identify())


def _emulate(power_w: Callable[[Any], Any], seed: int, name: str) -> int:
    from wattlab.hardware.emulators import pmd_emulator

    return pmd_emulator.run_emulator_cli(power_w)


KIND = register(MeterKind(
    kind="pmd", default_id="pmd", help="ElmorLabs PMD-USB on a USB serial port", build=_build,
    stream_rate=StreamRate(3_000.0, 100),  # 17-byte frames paced by a 500 kbaud line
    options={"baud": (positive_int, None), "rails": (rail_table(list(RAILS), "input"), None)},
    rails_of=input_rails(lambda key: key,
                         lambda key: tuple((f"{key}_{s}", s) for s in RAIL_SUFFIXES),
                         lambda key: f"{key}_power_w"),
    board_problem=needs_rails("pcie1"),
    usb_ids=((0x0483, 0x5740), (0x1A86, 0x7523)),  # STM32 CDC (PMD2), CH340 (PMD-USB)
    identify=_identify, emulate=_emulate, emulate_as=("pmd",),
    template="""
# ElmorLabs PMD-USB (USB serial). rails: input (pcie1, pcie2, eps1, eps2) = rail.
# [[device]]
# kind = "pmd"
# id = "pmd"
# port = "/dev/ttyUSB0"
# rails = { pcie1 = "cable_8pin_1", pcie2 = "cable_8pin_2" }
# gpu = 1
""",
))
