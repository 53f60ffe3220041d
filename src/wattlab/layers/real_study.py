"""`wattlab layers --measure` on a real GPU: its layers' time and energy inside real steps.

Why apart from study.py: it needs CUDA, the PyTorch profiler and NVML, none of which the
simulated path touches. The GPU is only read: clocks and limits stay as they are.
How: capture.py records the step three ways (hooked and profiled, plain and profiled,
plain with NVML's samples), step_energy.py turns the captures into rows and sums.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wattlab.layers import capture
from wattlab.layers.counting import LayerCount
from wattlab.layers.equivalent_time import DELAY_S
from wattlab.layers.step_energy import StepEnergy, analyse
from wattlab.runfile import LayersRecord

NAME = "step"


def measure_real(record: LayersRecord, model: Any, count: LayerCount, *, gpu: int,
                 seconds: float = capture.PLAIN_SECONDS, delay_s: float = DELAY_S,
                 keep: str | Path | None = None,
                 progress: Callable[[str], None] | None = None) -> LayersRecord:
    """Capture ``model``'s step on CUDA device ``gpu`` and measure every row inside it.

    The record with ``measured`` in its rows (time, power, energy, each ± se) and the
    sums' check under the scope's name (``with_step_energy``). NVML's GPU ``gpu`` must be
    CUDA's device ``gpu`` (true unless CUDA_VISIBLE_DEVICES reorders them). ``keep``: a
    folder that keeps the captures (else a temporary one).
    """
    import torch

    dtype = getattr(torch, count.dtype)
    torch.cuda.set_device(gpu)
    model = model.to("cuda", dtype).train(count.train)
    x = torch.randn(count.input_shape, device="cuda", dtype=dtype)
    with tempfile.TemporaryDirectory(prefix="wattlab-layers-") as tmp:
        folder = Path(keep) if keep else Path(tmp)
        if progress:
            progress(f"capturing: profiled steps, then {seconds:g} s of plain steps")
        capture.capture(model, x, folder, NAME, gpu=gpu, seconds=seconds, train=count.train)
        result = analyse(capture.load(folder, NAME), delay_s=delay_s)
    return with_step_energy(record, result)


def with_step_energy(record: LayersRecord, result: StepEnergy) -> LayersRecord:
    """The record with the captures' rows (where a row's key is among them) and check.

    Apart from `measure_real` so that saved captures make the same record without CUDA.
    """
    scope = "training step" if record.train else "forward"
    return record.measured_as(result.rows, {scope: result.check})
