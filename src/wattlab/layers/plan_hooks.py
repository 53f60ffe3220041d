"""A clock plan applied at layer boundaries through module hooks.

Why hooks: a plan is executed by the model itself, with no change to its code: a forward
pre-hook sets the layer's forward pair before it runs; a hook on its output's gradient sets
its backward pair when autograd reaches it. Here the hooks drive a recorder of operations
(the model runs on the meta device: shapes only), which the simulated GPU then executes;
a reused module (one ReLU called three times) switches at each of its calls, as it would
on a GPU, which the plan's search (one row per module) does not foresee.
"""

from __future__ import annotations

import copy
from typing import Any

from wattlab.layers.counting import LayerCount, _tensors, leaf_modules
from wattlab.layers.model_spec import import_torch

Op = tuple[str, float, float]


def traced_step(model: Any, count: LayerCount, pairs: dict[str, tuple[int, int]],
                default: tuple[int, int]) -> list[Op]:
    """The operations of one pass with ``pairs`` (row key -> SM, memory MHz) in force."""
    torch = import_torch()
    rows = {r.key: r for r in count.rows}
    ops: list[Op] = []

    def enter(key: str) -> None:
        ops.append(("clock", *pairs.get(key, default)))
        row = rows[key]
        ops.append(("run", row.work_flops / row.calls, row.bytes_total / row.calls))

    work = copy.deepcopy(model).to("meta").to(getattr(torch, count.dtype))
    work.train(count.train)
    handles = []
    for name, module in leaf_modules(work):
        label = name or "(model)"

        def pre(_m: Any, _args: Any, key: str = f"{label}:forward") -> None:
            enter(key)

        def post(_m: Any, _args: Any, out: Any, key: str = f"{label}:backward") -> None:
            for t in _tensors(out):
                if t.requires_grad and key in rows:
                    t.register_hook(lambda _g, key=key: enter(key))
                    break
        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    x = torch.zeros(count.input_shape, device="meta", dtype=getattr(torch, count.dtype))
    try:
        with torch.set_grad_enabled(count.train):
            out = work(x)
            if count.train:
                sum(t.sum() for t in _tensors(out) if t.requires_grad).backward()
    finally:
        for h in handles:
            h.remove()
    ops.append(("clock", *default))
    return ops
