"""The model's pass as training runs it, for the real GPU's captures (capture.py).

Why a function of its own: the profiled runs, the plain run and the step timings must run
the very same step, with no synchronisation inside it (the host queues ahead of the GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wattlab.layers.counting import _tensors

Job = Callable[[], Any]


def step_job(model: Any, x: Any, train: bool) -> Job:
    """The whole pass as the model runs it: forward, or forward + backward of a sum loss."""
    import torch

    def forward() -> None:
        with torch.no_grad():
            model(x)

    def train_step() -> None:
        outs = [t for t in _tensors(model(x)) if t.requires_grad]
        sum(t.float().sum() for t in outs).backward()
        for p in model.parameters():
            p.grad = None
    return train_step if train else forward
