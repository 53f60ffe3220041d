"""The simulated shared GPU's idle lead starts at the reader's first read (issue 34)."""

from __future__ import annotations

import pytest

from wattlab.hardware.shared_gpu import IDLE_LEAD_S, simulated_nvml
from wattlab.sync.recorder.live_energy.live_split import EDGE_MARGIN_NS, IDLE_MIN_NS

S = 1_000_000_000


class Clock:
    """A monotonic clock the test moves by hand (a loaded machine's late start, without a sleep)."""

    def __init__(self) -> None:
        self.now_ns = 10**15

    def __call__(self) -> int:
        return self.now_ns


def pids_at(lib, handle, clock: Clock, t_ns: int) -> list[int]:
    clock.now_ns = t_ns
    return [p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(handle)]


@pytest.mark.fast
@pytest.mark.parametrize("late_s", [0.0, 2.5, 5.0, 30.0])
def test_a_reader_opening_late_still_sees_the_whole_idle_lead(late_s):
    clock = Clock()
    lib = simulated_nvml(1, 7, shared_processes=3, clock_ns=clock)
    clock.now_ns += round(late_s * S)  # the session spawned its reader this late
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    lib.nvmlDeviceGetUUID(handle)  # describing the GPU does not start it
    open_ns = clock.now_ns
    lib.nvmlDeviceGetPowerUsage(handle)  # the reader's open: the GPU's clock starts here
    # long enough without a process for the live split to learn idle (live_split.py)
    quiet_ns = IDLE_MIN_NS + EDGE_MARGIN_NS
    assert quiet_ns < IDLE_LEAD_S * S
    for t_ns in range(open_ns, open_ns + quiet_ns + 1, S // 10):
        assert pids_at(lib, handle, clock, t_ns) == [], (late_s, (t_ns - open_ns) / S)
    assert pids_at(lib, handle, clock, open_ns + round(IDLE_LEAD_S * S) + 2 * S)
