"""Fixtures of the tests that need a real GPU (WATTLAB_DEVICE=1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def handle() -> Iterator[Any]:
    """GPU 0's NVML handle, NVML shut down after the test."""
    import pynvml

    pynvml.nvmlInit()
    try:
        yield pynvml.nvmlDeviceGetHandleByIndex(0)
    finally:
        pynvml.nvmlShutdown()
