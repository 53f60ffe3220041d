"""A callback at every leaf module's boundaries, forward and backward, without editing the model.

Used by the per-layer timing of `wattlab layers` (a CUDA event at each boundary of real
training steps), by the clock plans (a clock pair set at each boundary) and by
``--auto-markers=layers`` (a GPU-time marker at each boundary).

Forward: a pre-hook (begin) and a post-hook (end) on each leaf module. Backward begins when
the gradient of the module's output is ready (a tensor hook on the output) and ends when
the gradient reaches the module's inputs (an identity autograd function around each input
that needs one). Both run on the autograd engine's thread, which queues the backward
kernels on the forward's stream, so an event recorded there falls between the layer's
kernels and its neighbours'. Why not ``register_full_backward_hook``: it wraps the
module's *output* in an identity function, and an in-place change of that output is then
forbidden; torchvision's ResNet adds the residual in place to a batch norm's output
(``out += identity``) and fails. A tensor hook on the output is not disturbed by that.

In-place modules (``ReLU(inplace=True)``) run out of place while hooked (their input is
wrapped, and in-place on it is forbidden); ``remove()`` restores them. A module whose
input needs no gradient (the first convolution) has no backward end: its span runs to
the next boundary.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

Boundary = Callable[[str, str, str, int], None]  # (module path, pass, "begin"|"end", call)


def leaf_label(name: str) -> str:
    """The name rows use for a module path ("" is the model itself)."""
    return name or "(model)"


def is_leaf(module: Any) -> bool:
    return not any(True for _ in module.children())


@functools.cache
def _end_marker() -> Any:
    """An identity autograd function that calls back when its gradient passes (lazy: torch)."""
    import torch

    class BackwardEnd(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, callback: Callable[[], None], *xs: Any) -> Any:
            ctx.callback = callback
            return xs if len(xs) > 1 else xs[0]

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            ctx.callback()
            return (None, *grads)

    return BackwardEnd


class BoundaryHooks:
    """Calls ``on_boundary(label, pass, edge, call)`` at each leaf module's boundaries.

    ``modules``: (label, module) pairs to hook; ``backward``: also the backward boundaries
    (when autograd records the forward). ``call`` counts the module's calls since attach.
    """

    def __init__(self, modules: list[tuple[str, Any]], on_boundary: Boundary, *,
                 backward: bool = True) -> None:
        self.on_boundary = on_boundary
        self.backward = backward
        self.active = True  # off: the hooks return at once (a step that is not sampled)
        self.calls: dict[str, int] = {}
        self._inplace: list[Any] = []
        self._handles: list[Any] = []
        for label, module in modules:
            self._out_of_place(module)
            self._handles += [
                module.register_forward_pre_hook(functools.partial(self._pre, label)),
                module.register_forward_hook(functools.partial(self._post, label))]

    def _out_of_place(self, module: Any) -> None:
        if getattr(module, "inplace", False):
            module.inplace = False
            self._inplace.append(module)

    def _pre(self, label: str, _module: Any, args: Any) -> Any:
        if not self.active:
            return None
        call = self.calls.get(label, 0)
        self.calls[label] = call + 1
        self.on_boundary(label, "forward", "begin", call)
        if not self.backward:
            return None
        import torch

        wrap = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        if not wrap or not torch.is_grad_enabled():
            return None
        done = functools.partial(self.on_boundary, label, "backward", "end", call)
        wrapped = _end_marker().apply(done, *(args[i] for i in wrap))
        wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
        out = list(args)
        for i, w in zip(wrap, wrapped, strict=True):
            out[i] = w
        return tuple(out)

    def _post(self, label: str, _module: Any, _args: Any, output: Any) -> None:
        if not self.active or label not in self.calls:
            return
        call = self.calls[label] - 1
        self.on_boundary(label, "forward", "end", call)
        if not self.backward:
            return
        from wattlab.layers.counting import _tensors

        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(lambda _g: self.on_boundary(label, "backward", "begin", call))
                break

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        for module in self._inplace:
            module.inplace = True
        self._inplace = []

    def __enter__(self) -> BoundaryHooks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def hook_leaves(model: Any, on_boundary: Boundary, *, backward: bool = True) -> BoundaryHooks:
    """Hooks on every leaf module of ``model``, labelled by its path in the model."""
    return BoundaryHooks([(leaf_label(n), m) for n, m in model.named_modules() if is_leaf(m)],
                         on_boundary, backward=backward)


class GlobalBoundaryHooks(BoundaryHooks):
    """The same boundaries on every leaf module of every model (PyTorch's global hooks).

    Why: ``--auto-markers=layers`` has no handle on the program's model. Modules are
    labelled in the order first seen, ``3.Conv2d`` (no path is known without the model).
    """

    def __init__(self, on_boundary: Boundary, *, backward: bool = True) -> None:
        from torch.nn.modules import module as nn_module

        super().__init__([], on_boundary, backward=backward)
        self._labels: dict[int, str] = {}
        self._handles += [nn_module.register_module_forward_pre_hook(self._global_pre),
                          nn_module.register_module_forward_hook(self._global_post)]

    def _label(self, module: Any) -> str:
        label = self._labels.get(id(module))
        if label is None:
            label = self._labels[id(module)] = f"{len(self._labels)}.{type(module).__name__}"
            self._out_of_place(module)
        return label

    def _global_pre(self, module: Any, args: Any) -> Any:
        if not self.active or not is_leaf(module):
            return None
        return self._pre(self._label(module), module, args)

    def _global_post(self, module: Any, args: Any, output: Any) -> None:
        if self.active and is_leaf(module):
            self._post(self._label(module), module, args, output)
