"""One traced pass of a model as simulated-GPU operations, with a clock plan applied.

Why hooks: a plan is executed by the model itself, with no change to its code: at each
layer boundary (integrations.layer_hooks, the same hooks that time layers inside real
steps and put per-layer markers) the layer's pair is set before it runs, forward and
backward. Here the hooks drive a recorder of operations (the model runs on the meta
device: shapes only), which the simulated GPU then executes. A reused module (one ReLU
called three times) is a boundary, and so a possible switch, at each call: a plan may
give each call its own pair (key ``name:pass#call``) or one pair to all its calls.
With ``marks`` the boundaries are kept as ``mark`` operations, which the simulated GPU
times (per-layer time inside the step); a training step's loss runs between the passes,
outside every layer.
"""

from __future__ import annotations

import copy
from typing import Any

from wattlab.integrations.layer_hooks import hook_leaves
from wattlab.layers.counting import LayerCount, _tensors
from wattlab.layers.model_spec import import_torch

Op = tuple[str, Any, Any]


def call_key(key: str, call: int) -> str:
    """The plan key of one call of a row (``conv1:forward#0``)."""
    return f"{key}#{call}"


def traced_step(model: Any, count: LayerCount, pairs: dict[str, tuple[int, int]],
                default: tuple[int, int], *, marks: bool = False,
                calls: list[tuple[str, int]] | None = None) -> list[Op]:
    """The operations of one pass with ``pairs`` (row or call key -> SM, memory MHz) in force.

    ``calls``: gets (row key, call) of each layer call as it begins.
    """
    torch = import_torch()
    rows = {r.key: r for r in count.rows}
    ops: list[Op] = []

    def on(label: str, pass_name: str, edge: str, call: int) -> None:
        key = f"{label}:{pass_name}"
        if marks:
            ops.append(("mark", key, edge))
        if edge != "begin" or key not in rows:
            return
        if calls is not None:
            calls.append((key, call))
        row = rows[key]
        pair = pairs.get(call_key(key, call), pairs.get(key))
        if pair is not None:
            ops.append(("clock", *pair))
        ops.append(("run", row.work_flops / row.calls, row.bytes_total / row.calls))

    work = copy.deepcopy(model).to("meta").to(getattr(torch, count.dtype))
    work.train(count.train)
    x = torch.zeros(count.input_shape, device="meta", dtype=getattr(torch, count.dtype))
    with hook_leaves(work, on, backward=count.train), torch.set_grad_enabled(count.train):
        out = work(x)
        if count.train:
            outs = [t for t in _tensors(out) if t.requires_grad]
            size = sum(t.numel() for t in outs)
            ops.append(("run", float(size), float(size * outs[0].element_size())))  # the loss
            sum(t.sum() for t in outs).backward()
    ops.append(("clock", *default))
    return ops


def without_marks(ops: list[Op]) -> list[Op]:
    """The same pass with no boundary hooks (as the model runs unobserved)."""
    return [op for op in ops if op[0] != "mark"]



def call_sequence(model: Any, count: LayerCount) -> list[tuple[str, int]]:
    """(row key, call) of every layer call of one pass, in execution order.

    Forward, then backward in the order autograd runs it; a call's backward keeps its
    forward's number.
    """
    order: list[tuple[str, int]] = []
    traced_step(model, count, {}, (0, 0), calls=order)
    return order
