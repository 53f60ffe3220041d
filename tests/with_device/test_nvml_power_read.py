"""The power poll's C calls on a real NVIDIA GPU (opt-in: WATTLAB_DEVICE=1). Read-only.

``PowerRead`` hands the real ``nvmlDeviceGetFieldValues`` and ``nvmlDeviceGetPowerUsage``
kept ctypes structures; pynvml's wrappers build them per call. Read back to back, both must
say the same (the average updates every ~100 ms: most pairs fall inside one update).
"""

from __future__ import annotations

import os

import pynvml
import pytest

from wattlab.drivers.nvml_power import PowerRead

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(os.environ.get("WATTLAB_DEVICE") != "1",
                       reason="needs a real NVIDIA GPU: set WATTLAB_DEVICE=1"),
]


def test_power_read_matches_pynvmls_wrappers_on_the_real_library(handle):
    power = PowerRead(pynvml, handle)
    same_average = same_instant = 0
    for _ in range(50):
        instant_mw, status, average_mw = power.read()
        usage_mw = pynvml.nvmlDeviceGetPowerUsage(handle)
        [field] = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])
        assert status == field.nvmlReturn
        same_average += average_mw == usage_mw
        same_instant += status != pynvml.NVML_SUCCESS or instant_mw == field.value.uiVal
    assert same_average >= 40 and same_instant >= 40
