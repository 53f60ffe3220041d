"""`wattlab layers --measure` on a real GPU: its layers' energy, reading the GPU only.

Why apart from study.py: it needs CUDA, PyTorch on the GPU and NVML, none of which the
simulated path touches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from wattlab.acquisition.gpu_clock import EventBackend, TorchCudaEvents
from wattlab.layers import study
from wattlab.layers.counting import LayerCount, LayerRow
from wattlab.layers.in_step import record_marks
from wattlab.layers.torch_backend import (
    TorchBackend,
    capture_inputs,
    group_job,
    layer_job,
    step_job,
)


def measure_real(record: dict[str, Any], model: Any, count: LayerCount, *, gpu: int,
                 n_groups: int, window_s: float, whole_window_s: float = study.WHOLE_WINDOW_S,
                 progress: Callable[[str], None] | None = None, device: str = "cuda",
                 driver: Any = None, events: EventBackend | None = None) -> dict[str, Any]:
    """Measure every row of ``count`` and the whole pass on CUDA device ``gpu``.

    NVML's GPU ``gpu`` must be CUDA's device ``gpu`` (true unless CUDA_VISIBLE_DEVICES
    reorders them). ``device``, ``driver`` and ``events`` replace CUDA, NVML and CUDA's
    events (a test on a CPU with the fake NVML and fake events).
    """
    import torch

    from wattlab.drivers.nvml import NvmlDriver

    if device == "cuda":
        torch.cuda.set_device(gpu)
    dtype = getattr(torch, count.dtype)
    model = model.to(device, dtype).train(count.train)
    x = torch.randn(count.input_shape, device=device, dtype=dtype)
    inputs = capture_inputs(model, x)
    driver = driver or NvmlDriver()
    events = events or TorchCudaEvents()
    driver.open()
    try:
        backend = TorchBackend(lambda: driver.read_energy_j(gpu), events)

        def jobs_of(rows: Sequence[LayerRow]) -> list[Any]:
            return [layer_job(model, r, inputs) for r in rows]

        step = step_job(model, x, count.train)
        return study.measure_record(
            record, count, backend, jobs_of=jobs_of, combine=group_job, whole_job=step,
            step_marks=lambda n: record_marks(model, step, events, steps=n),
            n_groups=n_groups, window_s=window_s, whole_window_s=whole_window_s,
            progress=progress)
    finally:
        driver.close()
