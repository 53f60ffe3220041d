"""Each layer's time inside the simulated GPU's steps, from GPU times at every layer boundary.

(A real GPU's layers are timed from the kernels of a profiled step, kernel_trace.py: an
event at every boundary costs its host so much that a step of small layers waits on it.)

Why inside the step: a layer replayed alone pays the host's launch overhead (the module
call, ``autograd.grad``) which a real step hides by queueing ahead of the GPU, so a small
layer timed alone looks longer than it is. Events recorded at each leaf module's
boundaries during real steps (``integrations.layer_hooks``) land in the GPU's stream
order; the span between two consecutive boundaries belongs to the layer open there (the
latest begun and not yet ended), and a span where no layer is open (residual additions,
the loss, glue between modules) to the row ``between layers``. So the rows and
``between layers`` add up to the step exactly.

A mark is (row key, edge, time s): edge "begin" or "end" of a layer, or "step" at each
step's start (and after the last). Times are the GPU's (CUDA events; the simulated GPU's
virtual clock); the time per step is averaged over the steps, its standard error from
their spread.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wattlab.errors import WattlabError

BETWEEN = "between layers"
HOST_BOUND = 0.05  # an instrumented step this much slower than the plain one: host-bound
Mark = tuple[str, str, float]


@dataclass
class InStep:
    """Mean time per step of each row key (and ``BETWEEN``), with standard errors."""

    time_s: dict[str, float]
    time_se_s: dict[str, float]
    step_s: float
    step_se_s: float
    steps: int


def split_steps(marks: Sequence[Mark]) -> list[dict[str, float]]:
    """Per step, the time each key held the GPU (spans between consecutive marks)."""
    steps: list[dict[str, float]] = []
    open_keys: list[str] = []
    for (key, edge, t), (_, _, t_next) in itertools.pairwise(marks):
        if edge == "step":
            steps.append(defaultdict(float))
            open_keys = []
        elif edge == "begin":
            open_keys.append(key)
        elif key in open_keys:
            open_keys.remove(key)
        if steps:
            steps[-1][open_keys[-1] if open_keys else BETWEEN] += t_next - t
    return steps


def summarise(marks: Sequence[Mark]) -> InStep:
    """Mean and standard error over the steps of every key's time."""
    steps = split_steps(marks)
    if not steps:
        raise WattlabError("no complete step among the layer marks")
    keys = sorted({k for s in steps for k in s})
    n = len(steps)

    def stats(values: list[float]) -> tuple[float, float]:
        v = np.array(values)
        return float(v.mean()), float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0

    per_key = {k: stats([s.get(k, 0.0) for s in steps]) for k in keys}
    step_s, step_se = stats([sum(s.values()) for s in steps])
    return InStep({k: v[0] for k, v in per_key.items()},
                  {k: v[1] for k, v in per_key.items()}, step_s, step_se, n)
