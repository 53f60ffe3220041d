"""The toy meter as a wattlab acquirer, registered as meter kind ``toy``.

One reading every ``interval_s``, stamped at the middle of its query; the raw time is the
meter's own reading count, so a reading lost or read twice shows in the run file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from toy_meter.toy_driver import ToyMeter
from wattlab.acquisition.acquirers.acquirer import Chunk, Reading, sleep_until_due
from wattlab.acquisition.acquirers.meter_registry import MeterKind, StreamRate, register
from wattlab.acquisition.acquirers.serial_acquirer import SerialAcquirer
from wattlab.drivers.transport import ByteTransport, open_serial
from wattlab.errors import MeterError
from wattlab.option_checks import positive_number
from wattlab.samples import Channel, SourceDescriptor

DEFAULT_INTERVAL_S = 0.02
POLL_STEP_S = 0.1
CHANNELS = (Channel("voltage_v", "V"), Channel("current_a", "A"), Channel("power_w", "W"))


class ToyAcquirer(SerialAcquirer[ToyMeter]):
    """open: identify; poll: one reading when due; close: release the port."""

    def __init__(self, port: str, source_id: str = "toy", *,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 transport_factory: Callable[[str], ByteTransport] = open_serial) -> None:
        super().__init__(port, source_id, transport_factory)
        self.interval_s = interval_s
        self._due_ns = 0

    def open(self) -> list[SourceDescriptor]:
        self.driver = ToyMeter(self._open_port(), name=self.port)
        identity = self.driver.identify()
        self._due_ns = time.monotonic_ns()
        return [SourceDescriptor(source_id=self.source_id, kind="toy", model=identity,
                                 channels=CHANNELS, transport=f"serial:{self.port}",
                                 time_raw="device_reading_count",
                                 config={"interval_s": self.interval_s})]

    def poll(self) -> list[Reading]:
        if self.driver is None:
            raise MeterError(f"{self.port}: poll before open")
        if not sleep_until_due(self._due_ns, POLL_STEP_S):
            return []
        t0_ns = time.monotonic_ns()
        sample = self.driver.read()
        t1_ns = time.monotonic_ns()
        self._due_ns = max(self._due_ns + round(self.interval_s * 1e9), t1_ns)
        row = [sample.voltage_v, sample.current_a, sample.voltage_v * sample.current_a]
        return [Chunk(self.source_id, np.array([(t0_ns + t1_ns) // 2], dtype=np.int64),
                      np.array([row], dtype=np.float64), np.array([sample.count], dtype=np.int64))]


def _build(address: str, source_id: str, options: Mapping[str, Any]) -> ToyAcquirer:
    return ToyAcquirer(address, source_id, interval_s=float(options["interval_s"]))


def _identify(transport: ByteTransport) -> str:
    return ToyMeter(transport).identify()


def _emulate(power_w: Callable[[Any], Any], seed: int, name: str) -> int:
    from toy_meter.toy_emulator import run_emulator_cli

    return run_emulator_cli(power_w)


KIND = register(MeterKind(
    kind="toy", default_id="toy", help="the toy meter of docs/meters.md on a serial port",
    build=_build,
    stream_rate=StreamRate(50.0, 41),  # every 20 ms: times 8 + 8, values 3 x 8, flags 1 byte
    options={"interval_s": (positive_number, DEFAULT_INTERVAL_S)},
    identify=_identify, emulate=_emulate, emulate_as=("toy",),
    template="""
# The toy meter of docs/meters.md (serial). interval_s: seconds between readings.
# [[device]]
# kind = "toy"
# id = "toy"
# port = "/dev/ttyUSB0"
# interval_s = 0.02
""",
))
