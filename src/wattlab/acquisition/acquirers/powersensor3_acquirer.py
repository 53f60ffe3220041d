"""PowerSensor3 as an acquirer: open the port, describe the pairs, stream 20 kHz chunks.

Raw time is the device's 10-bit µs counter unwrapped (``device_us_unwrapped``); host
times come from the driver's device → host clock mapping, so per-sample times carry the
device's 50 µs spacing instead of the host's read jitter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading
from wattlab.acquisition.acquirers.meter_registry import (
    MeterKind,
    StreamRate,
    input_rails,
    needs_rails,
    register,
)
from wattlab.acquisition.acquirers.serial_acquirer import SerialAcquirer
from wattlab.drivers.powersensor3 import (
    DEVICE_CLOCK_WRAP_US,
    N_PAIRS,
    PowerSensor3,
    StreamBlock,
)
from wattlab.drivers.transport import ByteTransport, open_serial
from wattlab.errors import MeterError
from wattlab.option_checks import rail_table
from wattlab.samples import Gap, Marker, SampleFlag, SourceDescriptor

# What one poll reads before it is decoded and sent as one batch: each poll costs the
# source a decode and a send and the recorder a message (20 a second at 0.05 s cost ~3 %
# of a core, BENCHMARKS.md); what a crash of the whole recording can lose grows by it
# (docs/reliability.md: 0.25 s + the recorder's flush interval, issue 39)
POLL_COLLECT_S = 0.25
CLOSE_DRAIN_S = 0.5
NOMINAL_RATE_HZ = 20000
FRAME_PERIOD_US = 1_000_000 // NOMINAL_RATE_HZ
# A frame's step on the device clock is one period; further off, frames were lost (the
# emulator's steps are exact; a step 10 µs short already means a lost clock wrap)
STEP_TOLERANCE_US = 10


def fewest_frames_lost(step_us: int) -> int:
    """The fewest frames missing between two frames ``step_us`` apart on the device clock.

    Whole 1024 µs wraps are added only while the step is too short to hold one lost frame.
    """
    wraps = 0
    lost = round(step_us / FRAME_PERIOD_US) - 1
    while lost < 1:
        wraps += 1
        lost = round((step_us + wraps * DEVICE_CLOCK_WRAP_US) / FRAME_PERIOD_US) - 1
    return lost


class PowerSensor3Acquirer(SerialAcquirer[PowerSensor3]):
    """Acquirer protocol over one PowerSensor3."""

    def __init__(self, port: str, source_id: str = "ps3",
                 transport_factory: Callable[[str], ByteTransport] = open_serial) -> None:
        super().__init__(port, source_id, transport_factory)
        self.bytes_skipped = 0
        self.frames_lost = 0
        self._stopped = False
        self._last_frame: tuple[int, int] | None = None  # (device µs, host ns) of the newest

    def open(self) -> list[SourceDescriptor]:
        """Connect, read version and configuration, describe channels, start streaming."""
        self.driver = PowerSensor3(self._open_port(), name=self.port)
        info = self.driver.connect()
        if self.driver.scaling is None:
            raise MeterError(f"{self.port}: configuration was not read")
        desc = SourceDescriptor(
            source_id=self.source_id,
            kind="powersensor3",
            model="PowerSensor3",
            channels=tuple(self.driver.scaling.channels()),
            firmware=info.firmware,
            transport=f"serial:{self.port}",
            value_dtype="<f4",
            time_raw="device_us_unwrapped",
            config={
                "sensors": [c.to_json() for c in info.config],
                "active_pairs": self.driver.scaling.pairs,
                "nominal_rate_hz": NOMINAL_RATE_HZ,
                "time_raw_note": "10-bit µs device counter unwrapped by the host; "
                                 "estimated_time flags mark re-anchoring after lost data",
            },
        )
        self.driver.start()
        self._stopped = False
        return [desc]

    def poll(self) -> list[Reading]:
        """Read ``POLL_COLLECT_S`` of stream and turn it into a chunk, markers and resync gaps."""
        if self.driver is None:
            raise MeterError(f"{self.port}: poll before open")
        block = self.driver.read_stream(min_duration_s=POLL_COLLECT_S)
        return self._readings(block)

    def _readings(self, block: StreamBlock) -> list[Reading]:
        out: list[Reading] = []
        if block.n:
            out.append(Chunk(self.source_id, block.t_host_ns, block.values,
                             block.t_device_us, block.flags))
        for i in block.marker_index.tolist():
            out.append(Marker(int(block.t_host_ns[i]), "device_marker", "point", self.source_id))
        for i, nbytes in block.skip_events:
            self.bytes_skipped += nbytes
            before = int(block.t_host_ns[i - 1]) if 0 < i <= block.n else -1
            after = int(block.t_host_ns[i]) if i < block.n else -1
            out.append(Gap(self.source_id, f"resync: {nbytes} corrupt bytes skipped",
                           t_first_ns=before, t_last_ns=after))
        out += self._device_time_jumps(block)
        return out

    def _device_time_jumps(self, block: StreamBlock) -> list[Gap]:
        """Frames the device took but the host never got (its USB buffer overflowed).

        Their bytes are simply absent, so only the device clock shows the hole: a step
        between neighbours (also across reads) other than one frame period. The 10-bit clock
        gives a step modulo its 1024 µs wrap; whole wraps come from the host clock only when
        the hole outlasts its slack (the times after it are then re-anchored and flagged
        estimated). A shorter hole's count is a lower bound: 61 frames lost step 28 µs, 400
        step 594 µs; so is a hidden hole's (whole 25.6 ms) that the driver could only bound
        (its ``at_least``). Where bytes were skipped the resync gap already says so.
        """
        if not block.n:
            return []
        dev_us, host_ns = block.t_device_us, block.t_host_ns
        if self._last_frame is not None:
            dev_us = np.concatenate(([self._last_frame[0]], dev_us))
            host_ns = np.concatenate(([self._last_frame[1]], host_ns))
        self._last_frame = (int(block.t_device_us[-1]), int(block.t_host_ns[-1]))
        steps_us = np.diff(dev_us)
        offset = 0 if dev_us.shape[0] == block.n else 1
        resynced = {i + offset - 1 for i, _ in block.skip_events}
        re_anchored = (block.flags & SampleFlag.ESTIMATED_TIME).astype(bool)
        bounded = set(block.at_least)
        gaps = []
        odd = np.abs(steps_us - FRAME_PERIOD_US) > STEP_TOLERANCE_US
        for i in np.flatnonzero(odd).tolist():
            if i in resynced:
                continue
            step_us = int(steps_us[i])
            lost = fewest_frames_lost(step_us)
            self.frames_lost += lost
            if i + 1 - offset in bounded:
                why = (f"at least {lost} frames lost before they reached the host (whole "
                       "25.6 ms holes, counted by the host clock; every read after them was "
                       "too late to say how many)")
            elif re_anchored[i + 1 - offset]:
                why = f"{lost} frames lost before they reached the host (wraps by host clock)"
            else:
                why = (f"at least {lost} frames lost before they reached the host (each unseen "
                       "1.024 ms wrap of its clock adds 20.48)")
            gaps.append(Gap(self.source_id, f"device time jumped {step_us / 1000:.3f} ms: {why}",
                            t_first_ns=int(host_ns[i]), t_last_ns=int(host_ns[i + 1]),
                            samples_lost=lost))
        return gaps

    def flush(self) -> list[Reading]:
        """Stop with ``X`` and return every frame sent before the terminator (bounded wait)."""
        if self.driver is None or self._stopped:
            return []
        self._stopped = True
        return self._readings(self.driver.stop_and_flush(timeout_s=CLOSE_DRAIN_S))

    def _farewell(self) -> None:
        """Stop streaming, if ``flush`` did not."""
        if self.driver is not None and not self._stopped:
            self.driver.stop_and_flush(timeout_s=CLOSE_DRAIN_S)



def _build(address: str, source_id: str, options: Mapping[str, Any]) -> PowerSensor3Acquirer:
    return PowerSensor3Acquirer(address, source_id)


def _identify(transport: ByteTransport) -> str:
    return PowerSensor3(transport).read_version()


def _emulate(power_w: Callable[[Any], Any], seed: int, name: str) -> int:
    from wattlab.hardware.emulators.powersensor3_emulator import run_emulator_cli

    return run_emulator_cli(power_w, seed=seed)


KIND = register(MeterKind(
    kind="powersensor3", default_id="ps3", aliases=("ps3",),
    help="PowerSensor3 on a USB serial port", build=_build,
    stream_rate=StreamRate(20_000.0, 69),
    options={"rails": (rail_table([str(p) for p in range(N_PAIRS)], "pair"), None)},
    rails_of=input_rails(lambda p: f"pair {p}",
                         lambda p: ((f"current{p}_a", "current_a"),
                                    (f"voltage{p}_v", "voltage_v"), (f"power{p}_w", "power_w")),
                         lambda p: f"power{p}_w"),
    board_problem=needs_rails("0"),
    usb_ids=((0x0483, 0x5740),),  # STM32 USB CDC (also the PMD2's)
    identify=_identify, emulate=_emulate, emulate_as=("powersensor3",),
    template="""
# PowerSensor3 riser on GPU 0's PCIe power (USB serial). rails: pair number (0-3) = rail.
# [[device]]
# kind = "powersensor3"
# id = "ps3"
# port = "/dev/ttyACM0"
# rails = { 0 = "slot_12v", 1 = "slot_3v3", 2 = "cable_8pin_1", 3 = "cable_8pin_2" }
# gpu = 0
""",
))
