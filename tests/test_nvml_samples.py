"""The one-call sample drain: real ctypes calls into the fake NVML's C entry point."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pynvml
import pytest

from tests.test_nvml_driver import make
from wattlab.drivers.nvml import NvmlDriver
from wattlab.drivers.nvml_samples import SampleDrain, sample_dtype
from wattlab.errors import NvmlError
from wattlab.hardware.fake_nvml import FakeNvml


class PublicOnly:
    """The fake NVML without its C entry point: what a binding without the lookup offers."""

    def __init__(self, lib: FakeNvml) -> None:
        self._wrapped = lib

    def __getattr__(self, name: str) -> Any:
        if name == "_nvmlGetFunctionPointer":
            raise AttributeError(name)
        return getattr(self._wrapped, name)


def test_one_call_and_public_paths_give_the_same_samples() -> None:
    driver, lib, clock = make()
    public = NvmlDriver(PublicOnly(lib))
    with driver, public:
        for step_s in (0.3, 0.9, 1.7, 3.0):
            clock.advance(step_s)
            for last_seen in (0, 1_700_000_000_000_000 + int(clock() / 1e3) - 1_000_000):
                fast = driver.read_samples(0, last_seen)
                slow = public.read_samples(0, last_seen)
                assert fast[0].size > 0
                np.testing.assert_array_equal(fast[0], slow[0])
                np.testing.assert_array_equal(fast[1], slow[1])
        assert driver._drains[0].one_call and not public._drains[0].one_call


def test_an_array_too_small_falls_back_to_the_public_call() -> None:
    driver, lib, clock = make()
    clock.advance(5.0)  # the buffer is full: 120 samples
    with driver:
        handle = driver.handle(0)
        small = SampleDrain(lib, capacity=10)
        stamps, values = small(handle, 0)
        full = SampleDrain(lib)(handle, 0)
    assert stamps.size == 120
    np.testing.assert_array_equal(stamps, full[0])
    np.testing.assert_array_equal(values, full[1])


def test_nvml_errors_come_back_as_nvml_errors() -> None:
    driver, lib, clock = make(unsupported={"nvmlDeviceGetSamples"})
    clock.advance(1.0)
    with driver:
        with pytest.raises(pynvml.NVMLError) as raised:
            SampleDrain(lib)(driver.handle(0), 0)
        assert raised.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
        with pytest.raises(NvmlError, match=r"GPU 0: nvmlDeviceGetSamples.*Not Supported"):
            driver.read_samples(0, 0)


@pytest.mark.parametrize(("member", "value_type", "value"), [
    ("dVal", pynvml.NVML_VALUE_TYPE_DOUBLE, 412.25),
    ("uiVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 3_000_000_000),
    ("ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, 2**40 + 3),
    ("ullVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 2**50 + 5),
    ("sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, -(2**45)),
    ("siVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT, -123_456),
    ("usVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, 65_000),
])
def test_every_value_type_is_read_where_the_union_keeps_it(
    member: str, value_type: int, value: float
) -> None:
    array = (pynvml.c_nvmlSample_t * 2)()
    for i in range(2):
        array[i].timeStamp = 1_700_000_000_000_000 + i
        setattr(array[i].sampleValue, member, value)
    rows = np.frombuffer(array, dtype=sample_dtype(value_type), count=2)
    assert rows["t_us"].tolist() == [1_700_000_000_000_000, 1_700_000_000_000_001]
    assert rows["value"].tolist() == [value, value]
    assert sample_dtype(value_type).itemsize == ctypes.sizeof(pynvml.c_nvmlSample_t)


def test_an_unknown_value_type_is_named() -> None:
    with pytest.raises(NvmlError, match="unknown value type 99"):
        sample_dtype(99)
