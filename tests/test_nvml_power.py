"""The 90 ms power read through NVML's C entry points, and the fake's C entry points
answering nvidia-ml-py's own wrappers exactly as they answer wattlab."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from tests.test_nvml_driver import make
from wattlab.errors import NvmlError
from wattlab.hardware.fake_nvml import FakeNvml

pytestmark = pytest.mark.fast

WRAPPERS = ("nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage")


class NoWrappers:
    """Fails the test if the power read goes through pynvml-level wrappers."""

    def __init__(self, lib: FakeNvml) -> None:
        self._lib = lib

    def __getattr__(self, name: str) -> Any:
        if name in WRAPPERS:
            raise AssertionError(f"{name} called through its Python wrapper")
        return getattr(self._lib, name)


def test_power_read_is_the_c_calls_with_kept_structures() -> None:
    driver, lib, clock = make()
    clock.advance(3.3)
    with driver:
        driver._lib = NoWrappers(lib)  # after open: the reads alone
        gpu = lib.gpus[0]
        for _ in range(3):
            clock.advance(0.09)
            instant_w, average_w = driver.read_power(0)
            assert instant_w == gpu.instant_power_mw(clock()) / 1000
            assert average_w == gpu.average_power_mw(clock()) / 1000


def test_fake_c_entry_points_answer_pynvmls_own_wrappers(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    _, lib, clock = make(module_power=True)
    clock.advance(2.0)
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    # nvidia-ml-py's wrappers, unchanged, calling the fake's C entry points
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lib._nvmlGetFunctionPointer)
    ids = [pynvml.NVML_FI_DEV_POWER_INSTANT, (pynvml.NVML_FI_DEV_POWER_AVERAGE,
                                              pynvml.NVML_POWER_SCOPE_MODULE), 9999]
    real = pynvml.nvmlDeviceGetFieldValues(handle, ids)
    fake = lib.nvmlDeviceGetFieldValues(handle, ids)
    assert type(real) is type(fake)
    for r, f in zip(real, fake, strict=True):
        assert [getattr(r, n) for n, _ in r._fields_ if n != "value"] == \
            [getattr(f, n) for n, _ in f._fields_ if n != "value"]
        assert r.value.uiVal == f.value.uiVal
    assert real[1].scopeId == pynvml.NVML_POWER_SCOPE_MODULE
    assert real[2].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == lib.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPowerUsage(object())
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetFieldValues(object(), ids)


def test_unsupported_instant_is_none_and_a_failed_average_names_its_call() -> None:
    driver, _, clock = make(unsupported=frozenset({"NVML_FI_DEV_POWER_INSTANT"}))
    clock.advance(2.0)
    with driver:
        instant_w, average_w = driver.read_power(0)
        assert instant_w is None and average_w > 0
    driver, _, clock = make(unsupported=frozenset({"nvmlDeviceGetPowerUsage"}))
    clock.advance(2.0)
    with driver, pytest.raises(NvmlError, match="GPU 0: nvmlDeviceGetPowerUsage failed"):
        driver.read_power(0)
