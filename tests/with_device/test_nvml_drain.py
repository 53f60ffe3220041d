"""One-call drains on a real NVIDIA GPU (opt-in: WATTLAB_DEVICE=1). Read-only on the card.

``SampleDrain`` hands the real ``nvmlDeviceGetSamples`` ctypes pointers and an array it
keeps; pynvml's wrapper asks for the count first. Both must see the same samples.
"""

from __future__ import annotations

import os
import time

import pynvml
import pytest

from wattlab.drivers.nvml_samples import SampleDrain

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(os.environ.get("WATTLAB_DEVICE") != "1",
                       reason="needs a real NVIDIA GPU: set WATTLAB_DEVICE=1"),
]


def test_one_call_drain_matches_pynvml_on_the_real_library(handle):
    time.sleep(1.0)
    since_us = int((time.time() - 1.5) * 1e6)
    value_type, samples = pynvml.nvmlDeviceGetSamples(
        handle, pynvml.NVML_TOTAL_POWER_SAMPLES, since_us)
    stamps, power_mw = SampleDrain(pynvml).read(handle, since_us)  # later: a superset
    assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert len(samples) >= 40
    n = len(samples)
    assert sorted(stamps.tolist())[:n] == sorted(s.timeStamp for s in samples)
    by_stamp = dict(zip(stamps.tolist(), power_mw.tolist(), strict=True))
    assert all(by_stamp[s.timeStamp] == s.sampleValue.uiVal for s in samples)


def test_a_small_array_grows_on_the_real_library(handle):
    time.sleep(2.5)  # a full driver buffer
    drain = SampleDrain(pynvml, capacity=4)
    stamps, _ = drain.read(handle, 0)
    assert stamps.size >= 100 and drain.capacity >= stamps.size
    assert len(set(stamps.tolist())) == stamps.size
