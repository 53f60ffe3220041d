"""FLOPs, MACs and bytes moved per layer (leaf module), forward and backward separately.

Why PyTorch's own ``FlopCounterMode``: it counts the FLOPs of the aten operations each
module really runs (convolutions, matrix products, attention), forward and backward, and
attributes them to modules, so a model is counted as it executes, not as a formula guesses.
It counts 2 FLOPs per multiply-accumulate and nothing for elementwise operations (batch
norm, activations, pooling); for those layers the arithmetic intensity uses one operation
per element (``work_flops``). Bytes are what a layer must at least read and write:
weights and buffers, its input and output activations and, backward, the gradients.

Counting runs on the ``meta`` device by default: shapes only, no memory, no arithmetic.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from wattlab.errors import UsageError
from wattlab.layers.model_spec import import_torch
from wattlab.runfile import CountedLayer

PASSES = ("forward", "backward")


@dataclass
class LayerRow:
    """One leaf module in one pass (forward or backward), in execution order."""

    name: str  # the module's path in the model ("" for a model that is itself one layer)
    kind: str  # its class name
    pass_name: str  # "forward" or "backward"
    calls: int  # how often the module ran in one forward pass
    flops: int  # counted by FlopCounterMode (2 per multiply-accumulate)
    work_flops: int  # flops, or one operation per element where none were counted
    weight_bytes: int
    activation_bytes: int  # inputs and outputs (forward); saved activations (backward)
    gradient_bytes: int  # gradients read and written (backward only)
    in_shapes: list[list[int]] = field(default_factory=list)
    input_requires_grad: bool = False

    @property
    def macs(self) -> int:
        return self.flops // 2

    @property
    def bytes_total(self) -> int:
        return self.weight_bytes + self.activation_bytes + self.gradient_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: operations per byte moved."""
        return self.work_flops / self.bytes_total if self.bytes_total else math.inf

    @property
    def key(self) -> str:
        return f"{self.name or '(model)'}:{self.pass_name}"

    def to_record(self, bound: str) -> CountedLayer:
        """The row as the layer record keeps it, with its roofline class ``bound``."""
        return CountedLayer(
            name=self.name, kind=self.kind, pass_name=self.pass_name, calls=self.calls,
            flops=self.flops, work_flops=self.work_flops, weight_bytes=self.weight_bytes,
            activation_bytes=self.activation_bytes, gradient_bytes=self.gradient_bytes,
            in_shapes=tuple(tuple(s) for s in self.in_shapes),
            input_requires_grad=self.input_requires_grad, macs=self.macs,
            bytes_total=self.bytes_total,
            intensity=None if math.isinf(self.intensity) else self.intensity, bound=bound)


@dataclass
class LayerCount:
    """Every layer row plus the totals FlopCounterMode saw (leaf modules and the rest)."""

    rows: list[LayerRow]
    total_flops: int  # forward (+ backward when train) of the whole model
    other_flops: int  # counted outside any leaf module (functional calls in forward())
    input_shape: tuple[int, ...]
    dtype: str
    train: bool

    @property
    def total_macs(self) -> int:
        return self.total_flops // 2

    def of_pass(self, pass_name: str) -> list[LayerRow]:
        return [r for r in self.rows if r.pass_name == pass_name]


@dataclass
class _Seen:
    """What the forward hooks saw of one leaf module."""

    order: int
    calls: int = 0
    in_bytes: int = 0
    out_bytes: int = 0
    out_numel: int = 0
    in_numel: int = 0
    in_shapes: list[list[int]] = field(default_factory=list)
    input_requires_grad: bool = False


def _tensors(obj: Any) -> list[Any]:
    torch = import_torch()
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _nbytes(tensors: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def leaf_modules(model: Any) -> list[tuple[str, Any]]:
    """(path, module) of every module without children."""
    return [(n, m) for n, m in model.named_modules() if not any(True for _ in m.children())]


def _watch(leaves: list[tuple[str, Any]], seen: dict[str, _Seen]) -> list[Any]:
    """Forward hooks recording call order, input shapes and activation bytes."""
    handles = []
    for name, module in leaves:
        def hook(_m: Any, args: Any, out: Any, name: str = name) -> None:
            s = seen.setdefault(name, _Seen(order=len(seen)))
            ins, outs = _tensors(args), _tensors(out)
            s.calls += 1
            s.in_bytes += _nbytes(ins)
            s.out_bytes += _nbytes(outs)
            s.in_numel += sum(t.numel() for t in ins)
            s.out_numel += sum(t.numel() for t in outs)
            if s.calls == 1:
                s.in_shapes = [list(t.shape) for t in ins]
            s.input_requires_grad |= any(t.requires_grad for t in ins)
        handles.append(module.register_forward_hook(hook))
    return handles


def _flops_by_module(counter: Any) -> dict[str, int]:
    return {k: int(sum(v.values())) for k, v in counter.get_flop_counts().items()}


def count_layers(model: Any, input_shape: tuple[int, ...], dtype: str = "float32",
                 train: bool = False, device: str = "meta") -> LayerCount:
    """Count every leaf module's work for one forward (and, with ``train``, backward) pass.

    The model is copied (its own weights stay where they are) and run on ``device``.
    """
    torch = import_torch()
    from torch.utils.flop_counter import FlopCounterMode

    work = copy.deepcopy(model).to(device=device, dtype=getattr(torch, dtype))
    work.train(train)
    leaves = leaf_modules(work)
    root = type(work).__name__
    seen: dict[str, _Seen] = {}
    handles = _watch(leaves, seen)
    x = torch.zeros(input_shape, device=device, dtype=getattr(torch, dtype))
    counter = FlopCounterMode(display=False)
    try:
        with counter, torch.set_grad_enabled(train):
            out = work(x)
            fwd = _flops_by_module(counter)
            if train:
                outs = [t for t in _tensors(out) if t.requires_grad]
                if not outs:
                    raise UsageError("--train: the model's output does not require grad")
                # a scalar loss: the module tracker sees the backward of the last module only
                # when its output's gradient is computed, not when it is handed in
                sum(t.sum() for t in outs).backward()
        both = _flops_by_module(counter)
    except RuntimeError as e:
        raise UsageError(f"the model does not run on input {'x'.join(map(str, input_shape))} "
                         f"({dtype}): {e}") from e
    finally:
        for h in handles:
            h.remove()
    rows: list[LayerRow] = []
    ran = sorted((s.order, name) for name, s in seen.items())
    modules = dict(leaves)
    params = {n: [p for p in m.parameters(recurse=False)] for n, m in leaves}
    leaf_fwd = leaf_bwd = 0
    for _, name in ran:
        s, key = seen[name], root if name == "" else f"{root}.{name}"
        w_bytes = _nbytes(params[name]) + _nbytes(list(modules[name].buffers(recurse=False)))
        flops = fwd.get(key, 0)
        leaf_fwd += flops
        rows.append(LayerRow(name, type(modules[name]).__name__, "forward", s.calls, flops,
                             flops or max(s.in_numel, s.out_numel), w_bytes,
                             s.in_bytes + s.out_bytes, 0, s.in_shapes, s.input_requires_grad))
    if train:
        for _, name in reversed(ran):
            s, key = seen[name], root if name == "" else f"{root}.{name}"
            trainable = [p for p in params[name] if p.requires_grad]
            if not (s.input_requires_grad or trainable):
                continue  # no gradient flows through it
            flops = both.get(key, 0) - fwd.get(key, 0)
            leaf_bwd += flops
            p_bytes = _nbytes(trainable)
            grad_in = s.in_bytes if s.input_requires_grad else 0
            weights_read = _nbytes(params[name]) if s.input_requires_grad else 0
            rows.append(LayerRow(name, type(modules[name]).__name__, "backward", s.calls,
                                 flops, flops or max(s.in_numel, s.out_numel), weights_read,
                                 s.in_bytes, s.out_bytes + grad_in + p_bytes, s.in_shapes,
                                 s.input_requires_grad))
    total = both.get("Global", 0)
    return LayerCount(rows, total, total - leaf_fwd - leaf_bwd, tuple(input_shape), dtype,
                      train)
