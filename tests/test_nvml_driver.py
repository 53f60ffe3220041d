"""NvmlDriver against FakeNvml and the real pynvml's shape; never changes a real GPU."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pynvml
import pytest

from wattlab.device_models.workload_schedule import WorkloadSchedule
from wattlab.drivers.nvml import NO_LIBRARY_MESSAGE, NVML_CALLS, STATE_READINGS, NvmlDriver
from wattlab.errors import NvmlError, UsageError
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.simulated_gpu import SimulatedGpu

pytestmark = pytest.mark.fast

S = 1_000_000_000
UNIX0 = 1_700_000_000 * S


class FakeClock:
    def __init__(self, t_ns: int = 0) -> None:
        self.t_ns = t_ns

    def __call__(self) -> int:
        return self.t_ns

    def advance(self, dt_s: float) -> None:
        self.t_ns += round(dt_s * 1e9)


def make(n_gpus: int = 1, **gpu_kwargs: Any) -> tuple[NvmlDriver, FakeNvml, FakeClock]:
    clock = FakeClock()
    gpus = [
        SimulatedGpu(
            index=i,
            seed=10 + i,
            schedule=WorkloadSchedule.demo(i, 20.0),
            clock_ns=clock,
            start_ns=0,
            unix_offset_ns=UNIX0,
            **gpu_kwargs,
        )
        for i in range(n_gpus)
    ]
    lib = FakeNvml(gpus)
    return NvmlDriver(lib), lib, clock


# ---------------------------------------------------------------- session and identity


def test_device_info_reads_identity_and_limits() -> None:
    driver, lib, _ = make()
    with driver:
        info = driver.device_info(0)
    gpu = lib.gpus[0]
    assert info.name == "Simulated H100 80GB HBM3"
    assert (info.uuid, info.serial, info.board_part_number) == (
        gpu.uuid,
        gpu.serial,
        gpu.board_part_number,
    )
    assert (info.driver_version, info.nvml_version) == ("580.159.04", "13.580.159.04")
    assert (info.power_limit_min_w, info.power_limit_max_w) == (200.0, 700.0)
    assert info.power_limit_default_w == info.power_limit_w == 700.0
    assert len(info.sm_clocks_mhz) == 110
    assert (max(info.sm_clocks_mhz), min(info.sm_clocks_mhz)) == (1980, 345)
    assert info.mem_clocks_mhz == [2619, 1593]
    assert info.missing == {}
    assert info.to_json()["uuid"] == gpu.uuid
    assert lib.init_count == 0  # closed again


def test_unsupported_fields_are_left_out_with_a_note() -> None:
    driver, _, clock = make(
        unsupported={"nvmlDeviceGetSerial", "NVML_FI_DEV_POWER_INSTANT", "nvmlDeviceGetTemperature"}
    )
    clock.advance(2.0)
    with driver:
        info = driver.device_info(0)
        assert info.serial == ""
        assert info.missing == {"serial": "Not Supported"}
        missing = driver.probe(0)
        assert set(missing) == {"instant_power_w", "temperature_c"}
        instant_w, average_w = driver.read_power(0)
        assert instant_w is None and average_w > 0
        state = driver.read_state(0)
        assert "temperature_c" not in state and state["sm_clock_hz"] > 0


def test_nested_open_is_counted() -> None:
    driver, lib, _ = make()
    driver.open()
    driver.open()
    assert lib.init_count == 1
    driver.close()
    assert lib.init_count == 1
    driver.close()
    assert lib.init_count == 0
    driver.close()  # harmless


def test_no_library_gives_one_clear_line() -> None:
    lib = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(NvmlError) as e:
        NvmlDriver(lib).open()
    assert str(e.value).startswith(NO_LIBRARY_MESSAGE)
    assert "\n" not in str(e.value)
    assert isinstance(e.value.__cause__, pynvml.NVMLError_LibraryNotFound)


def test_driver_not_loaded_and_other_init_errors() -> None:
    class NoDriver:
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    with pytest.raises(NvmlError, match="NVML library not found"):
        NvmlDriver(NoDriver()).open()
    lib = FakeNvml([], init_error=pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(NvmlError, match="NVML failed to initialise: Insufficient Permissions"):
        NvmlDriver(lib).open()


def test_real_pynvml_without_a_gpu_gives_the_clear_error() -> None:
    driver = NvmlDriver()  # the real pynvml module
    try:
        driver.open()
    except NvmlError as e:
        assert str(e).startswith(NO_LIBRARY_MESSAGE)
        return
    driver.close()  # init and shutdown only: read-only on a machine that has a GPU
    pytest.skip("this machine has an NVIDIA driver; the no-library path is tested with fakes")


def test_calls_after_close_name_gpu_and_call() -> None:
    driver, _, _ = make()
    driver.open()
    driver.close()
    with pytest.raises(NvmlError, match=r"GPU 0: nvmlDeviceGetHandleByIndex failed: Uninit"):
        driver.read_energy_j(0)


# ---------------------------------------------------------------- resolve_gpus


def test_resolve_gpus() -> None:
    driver, _, _ = make(n_gpus=2)
    with driver:
        assert driver.resolve_gpus("all") == [0, 1]
        assert driver.resolve_gpus("1") == [1]
        assert driver.resolve_gpus(" 1 , 0,1") == [1, 0]
        with pytest.raises(
            UsageError,
            match=r"GPU index 2 not found: this machine has 2 GPUs "
            r"\(indices 0-1\)",
        ):
            driver.resolve_gpus("0,2")
        for bad in ("", "x", "0;1", "-1", "1.0", "0,,1", "²", "١"):  # digits int() refuses or reads
            with pytest.raises(UsageError, match="is not valid"):
                driver.resolve_gpus(bad)


def test_resolve_gpus_message_for_one_and_no_gpu() -> None:
    driver, _, _ = make(n_gpus=1)
    with driver, pytest.raises(UsageError) as e:
        driver.resolve_gpus("3")
    assert str(e.value) == "GPU index 3 not found: this machine has 1 GPU (index 0)"
    empty = NvmlDriver(FakeNvml([]))
    with empty:
        with pytest.raises(UsageError, match="no GPU"):
            empty.resolve_gpus("all")
        with pytest.raises(UsageError, match="this machine has no GPU"):
            empty.resolve_gpus("0")


def test_bad_index_from_nvml_is_named() -> None:
    driver, _, _ = make()
    with (
        driver,
        pytest.raises(
            NvmlError, match="GPU 5: nvmlDeviceGetHandleByIndex failed: Invalid Argument"
        ),
    ):
        driver.read_power(5)


# ---------------------------------------------------------------- readings


def test_readings_are_in_si_units() -> None:
    driver, lib, clock = make()
    gpu = lib.gpus[0]
    clock.advance(3.3)
    with driver:
        instant_w, average_w = driver.read_power(0)
        assert instant_w == gpu.instant_power_mw(clock()) / 1000
        assert average_w == gpu.average_power_mw(clock()) / 1000
        assert driver.read_energy_j(0) == gpu.energy_mj(clock()) / 1000
        state = driver.read_state(0)
        assert state["sm_clock_hz"] == gpu.sm_clock_mhz(clock()) * 1e6
        assert state["mem_clock_hz"] == 2619e6
        assert state["power_limit_w"] == 700.0
        assert 0 <= state["gpu_util_pct"] <= 100
        assert 20 < state["temperature_c"] < 100
        assert list(state) == [name for name, _, _ in STATE_READINGS]


def test_read_samples_drains_without_loss_or_duplicates() -> None:
    driver, lib, clock = make()
    gpu = lib.gpus[0]
    rng = np.random.default_rng(0)
    drained: list[np.ndarray] = []
    expected: set[int] = set()
    last_seen = 0
    with driver:
        for _ in range(60):
            step = float(rng.uniform(0.01, 1.5))
            for frac in (0.25, 0.5, 0.75, 1.0):  # what the buffer held in between
                expected.update(gpu.power_samples(clock() + round(step * frac * 1e9))[0].tolist())
            clock.advance(step)
            stamps, power_w = driver.read_samples(0, last_seen)
            assert stamps.dtype == np.int64 and power_w.dtype == np.float64
            if stamps.size:
                assert stamps[0] > last_seen
                last_seen = int(stamps[-1])
                assert np.all((power_w > 30) & (power_w < 1200))
            drained.append(stamps)
    all_stamps = np.concatenate(drained)
    assert np.all(np.diff(all_stamps) > 0)
    assert all_stamps.tolist() == sorted(expected)
    assert len(all_stamps) > 1000


def test_empty_buffer_is_empty_arrays() -> None:
    driver, _, clock = make()
    with driver:
        stamps, power_w = driver.read_samples(0, 0)  # t = 0: nothing sampled yet
        assert stamps.shape == power_w.shape == (0,)
        clock.advance(1.0)
        stamps, _ = driver.read_samples(0, 0)
        last = int(stamps[-1])
        assert driver.read_samples(0, last)[0].size == 0


def test_overflowed_buffer_keeps_only_the_newest() -> None:
    driver, _, clock = make()
    clock.advance(5.0)
    with driver:
        stamps, _ = driver.read_samples(0, 0)
    assert stamps.size == 120
    assert (stamps[-1] - stamps[0]) / 1e6 == pytest.approx(2.38, abs=0.02)


# ---------------------------------------------------------------- setters (fake only)


def test_setters_change_the_simulated_gpu() -> None:
    driver, lib, clock = make()
    gpu = lib.gpus[0]
    with driver:
        clock.advance(1.0)
        driver.set_power_limit_w(0, 300.0)
        assert gpu.power_limit_w == 300.0 and driver.get_power_limit_w(0) == 300.0
        driver.lock_sm_clocks(0, 1000, 1200)
        assert gpu.locked_clocks_mhz == (1000.0, 1200.0)
        driver.reset_clocks(0)
        assert gpu.locked_clocks_mhz is None
        with pytest.raises(
            UsageError,
            match=r"GPU 0: power limit 150 W is outside its range "
            r"200-700 W",
        ):
            driver.set_power_limit_w(0, 150.0)
        with pytest.raises(UsageError, match="not valid"):
            driver.lock_sm_clocks(0, 1500, 1000)


def test_setters_without_permission_say_root() -> None:
    driver, lib, _ = make(settable=False)
    with driver:
        with pytest.raises(NvmlError, match="GPU 0: setting the power limit needs root"):
            driver.set_power_limit_w(0, 300.0)
        with pytest.raises(NvmlError, match="needs root"):
            driver.lock_sm_clocks(0, 1000, 1200)
        with pytest.raises(NvmlError, match="needs root"):
            driver.reset_clocks(0)
    assert lib.gpus[0].power_limit_w == 700.0


# ---------------------------------------------------------------- the real pynvml's shape


def test_fake_nvml_matches_the_real_pynvml_signatures() -> None:
    """Every call FakeNvml offers exists in pynvml with the same parameters, in order."""
    names = [n for n in dir(FakeNvml) if n.startswith("nvml")]
    assert len(names) >= 25
    for name in names:
        real = inspect.signature(getattr(pynvml, name))
        fake = inspect.signature(getattr(FakeNvml, name))
        real_params = [p.name for p in real.parameters.values()]
        fake_params = [p.name for p in fake.parameters.values()][1:]  # minus self
        # pynvml names the handle "handle" or "device"; the rest must agree exactly
        norm = [("handle" if p == "device" else p) for p in real_params]
        assert fake_params == norm, (name, real_params, fake_params)


def test_driver_uses_only_calls_the_fake_and_pynvml_both_have() -> None:
    driver, lib, clock = make()
    clock.advance(2.0)
    with driver:
        driver.device_info(0)
        driver.probe(0)
        driver.read_samples(0, 0)
        driver.read_power(0)
        driver.read_energy_j(0)
        driver.read_state(0)
    used = lib.calls
    assert used >= {
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetSamples",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption",
    }
    for name in used:
        assert callable(getattr(pynvml, name))
    for call in NVML_CALLS.values():
        assert callable(getattr(pynvml, call.split("(")[0]))


def test_real_structures_are_returned() -> None:
    _, lib, clock = make()
    clock.advance(1.0)
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    value_type, samples = lib.nvmlDeviceGetSamples(h, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert isinstance(samples, list) and isinstance(samples[0], pynvml.c_nvmlSample_t)
    fv = lib.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT, 9999])
    assert fv[0].nvmlReturn == pynvml.NVML_SUCCESS and fv[0].value.uiVal > 0
    assert fv[0].fieldId == pynvml.NVML_FI_DEV_POWER_INSTANT
    assert fv[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    util = lib.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(util, pynvml.c_nvmlUtilization_t)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        lib.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetHandleByIndex(1)
    lib.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        lib.nvmlDeviceGetCount()
