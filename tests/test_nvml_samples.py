"""SampleDrain: one NVML call a drain, read in place, and the edges of NVML's contract.

The simulated GPU's C-level ``nvmlDeviceGetSamples`` (``FakeNvml._c_get_samples``) takes the
same ctypes pointers the real C function does; hand-written C-shaped functions cover value
types and size errors the simulator never produces. The real library is exercised by
``tests/with_device``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np
import pynvml
import pytest

from wattlab.drivers.nvml_samples import MAX_CAPACITY, SampleDrain, UnknownValueType
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import SimulatedGpu

pytestmark = pytest.mark.fast

S = 1_000_000_000
UNIX0 = 1_700_000_000 * S


class CountingLib:
    """A pynvml-shaped object whose C function counts its calls."""

    def __init__(self, fn: Callable[..., int]) -> None:
        self.fn = fn
        self.calls = 0

    def _nvmlGetFunctionPointer(self, name: str) -> Callable[..., int]:
        assert name == "nvmlDeviceGetSamples"

        def counted(*args: Any) -> int:
            self.calls += 1
            return self.fn(*args)

        return counted


def simulated(seconds: float) -> tuple[FakeNvml, Any]:
    """A simulated GPU ``seconds`` after its start, NVML initialised, and its handle."""
    lib = FakeNvml([SimulatedGpu(seed=4, clock_ns=lambda: round(seconds * S), start_ns=0,
                                 unix_offset_ns=UNIX0)])
    lib.nvmlInit()
    return lib, lib.nvmlDeviceGetHandleByIndex(0)


def test_one_call_gives_what_pynvml_gives_in_two() -> None:
    lib, handle = simulated(1.5)
    counting = CountingLib(lib._nvmlGetFunctionPointer("nvmlDeviceGetSamples"))
    drain = SampleDrain(counting)
    for since_us in (0, UNIX0 // 1000 + 700_000):
        stamps, power_mw = drain.read(handle, since_us)
        value_type, samples = lib.nvmlDeviceGetSamples(
            handle, pynvml.NVML_TOTAL_POWER_SAMPLES, since_us)
        assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        assert stamps.tolist() == [s.timeStamp for s in samples]
        assert power_mw.tolist() == [float(s.sampleValue.uiVal) for s in samples]
        assert stamps.dtype == np.int64 and power_mw.dtype == np.float64
    assert counting.calls == 2  # one per drain
    assert stamps.size == 40 and stamps[0] > UNIX0 // 1000 + 700_000


def test_a_buffer_too_small_grows_and_loses_nothing() -> None:
    lib, handle = simulated(5.0)  # the driver holds 120 samples
    counting = CountingLib(lib._nvmlGetFunctionPointer("nvmlDeviceGetSamples"))
    drain = SampleDrain(counting, capacity=8)
    stamps, _ = drain.read(handle, 0)
    _, samples = lib.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    assert stamps.size == 120 and stamps.tolist() == [s.timeStamp for s in samples]
    assert drain.capacity == 128
    assert counting.calls == 5  # 8, 16, 32, 64 came back full; 128 did not
    counting.calls = 0
    drain.read(handle, 0)
    assert counting.calls == 1  # the grown array is kept


def test_nothing_new_is_empty_and_other_failures_raise() -> None:
    lib, handle = simulated(0.0)  # nothing sampled yet: NVML says NOT_FOUND
    drain = SampleDrain(lib)
    stamps, power_mw = drain.read(handle, 0)
    assert stamps.shape == power_mw.shape == (0,)
    unsupported = FakeNvml([SimulatedGpu(unsupported=frozenset({"nvmlDeviceGetSamples"}))])
    unsupported.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        SampleDrain(unsupported).read(unsupported.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        lib._nvmlGetFunctionPointer("nvmlDeviceGetTemperature")


def c_function(rows: list[tuple[int, float]], value_type: int,
               too_small: int = pynvml.NVML_SUCCESS) -> Callable[..., int]:
    """A C-shaped nvmlDeviceGetSamples serving ``rows`` as ``value_type``; an array shorter
    than the rows gets ``too_small`` (NVML_SUCCESS: filled and truncated)."""
    member = {pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
              pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
              pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal"}.get(value_type, "uiVal")

    def fn(handle: Any, sampling: Any, since: Any, vtype: Any, count: Any, out: Any) -> int:
        assert isinstance(since, ctypes.c_ulonglong) and sampling.value == 0
        vtype.contents.value = value_type
        if count.contents.value < len(rows) and too_small != pynvml.NVML_SUCCESS:
            return too_small
        n = min(len(rows), count.contents.value)
        for i, (stamp, value) in enumerate(rows[:n]):
            out[i].timeStamp = stamp
            setattr(out[i].sampleValue, member, type(getattr(out[i].sampleValue, member))(value))
        count.contents.value = n
        return pynvml.NVML_SUCCESS

    return fn


@pytest.mark.parametrize(("value_type", "values"), [
    (pynvml.NVML_VALUE_TYPE_DOUBLE, [412.5, 0.25]),
    (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, [-3, 2**40]),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, [65535, 7]),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, [2**32 - 1, 0]),
])
def test_every_declared_value_type_is_read_from_its_union_member(value_type, values) -> None:
    rows = [(1_000 + i, v) for i, v in enumerate(values)]
    stamps, read = SampleDrain(CountingLib(c_function(rows, value_type))).read(None, 0)
    assert stamps.tolist() == [1_000, 1_001] and read.tolist() == [float(v) for v in values]


def test_an_unknown_value_type_is_refused() -> None:
    with pytest.raises(UnknownValueType, match="unknown value type 99"):
        SampleDrain(CountingLib(c_function([(1, 2.0)], 99))).read(None, 0)


def test_insufficient_size_grows_the_array_too() -> None:
    rows = [(10 + i, float(i)) for i in range(300)]
    lib = CountingLib(c_function(rows, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                                 too_small=pynvml.NVML_ERROR_INSUFFICIENT_SIZE))
    stamps, _ = SampleDrain(lib).read(None, 0)
    assert stamps.size == 300 and lib.calls == 2  # 256, then 512


def test_an_array_always_filled_ends_in_an_error_not_a_loop() -> None:
    def always_full(handle, sampling, since, vtype, count, out) -> int:
        vtype.contents.value = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        return pynvml.NVML_SUCCESS  # count left as given: "every slot written"

    lib = CountingLib(always_full)
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        SampleDrain(lib, capacity=MAX_CAPACITY // 4).read(None, 0)
    assert lib.calls == 3
