"""The whole bench with no hardware: one simulated GPU and emulated meters measuring it.

Every emulator draws from the simulated GPU's *true* board power, so a demo run shows
the meters' and NVML's views of the same load, with the artefacts each really has.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType

from wattlab.device_models import WorkloadSchedule
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import SimulatedGpu

PowerFn = Callable[[int], float]


def looping_gpu(seed: int, duration_s: float = 20.0) -> SimulatedGpu:
    """A simulated GPU whose demo workload repeats, for emulators left running for long."""
    demo = WorkloadSchedule.demo(seed, duration_s)
    return SimulatedGpu(0, seed, WorkloadSchedule(demo.segments, repeat=True))


class VirtualBench:
    """Simulated GPU + emulated PowerSensor3 (pty) + emulated WT310E (TCP), started together.

    Use as a context manager; ``nvml`` is an NVML library for ``NvmlDriver``, ``ps3_port``
    a pty path for the PowerSensor3 driver, ``wall_resource`` a VISA resource string.
    """

    def __init__(self, seed: int, duration_s: float, meters: bool = True) -> None:
        self.gpu = SimulatedGpu(0, seed, WorkloadSchedule.demo(seed, duration_s))
        self.nvml = FakeNvml([self.gpu])
        self.meters = meters
        self.ps3_port = ""
        self.wall_resource = ""
        self._stack = ExitStack()

    def __enter__(self) -> VirtualBench:
        if self.meters:
            from wattlab.hardware.emulators.powersensor3_emulator import PowerSensor3Emulator
            from wattlab.hardware.emulators.wt300e_emulator import Wt300eEmulator

            try:
                ps3 = self._stack.enter_context(PowerSensor3Emulator(self.gpu.true_power_w))
                self.ps3_port = ps3.path
                wall = self._stack.enter_context(Wt300eEmulator("WT310E", self.gpu.true_power_w))
                self.wall_resource = wall.resource
            except BaseException:
                self._stack.close()
                raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()
