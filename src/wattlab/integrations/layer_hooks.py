"""A callback at every leaf module's boundaries, forward and backward, without editing the model.

Used by the per-layer timing of `wattlab layers` (a CUDA event at each boundary of real
training steps), by the clock plans (a clock pair set at each boundary) and by
``--auto-markers=layers`` (a GPU-time marker at each boundary).

Forward: a pre-hook (begin) and a post-hook (end) on each leaf module. Backward: hooks on
the module's own autograd nodes, found from its output when the forward ends: a pre-hook
on the output's node (begin: the output's gradient has arrived) and a post-hook on each
of the module's last nodes (end: the gradient has reached its inputs and its weights).
The autograd engine queues the backward kernels on the forward's stream from the thread
that runs these hooks, so an event recorded there falls between the layer's kernels and
its neighbours'. Why not ``register_full_backward_hook``: it wraps the module's output in
an identity function, after which an in-place change of the output is forbidden
(torchvision's ResNet adds the residual in place to a batch norm's output), and that
Python function costs ~30 µs a layer on the host; node hooks change no tensor.

A module's nodes are those reached from its output's node before its inputs' nodes and
the weights' accumulators; a module that builds more than ``MAX_NODES`` (not a layer)
ends at its output's node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

Boundary = Callable[[str, str, str, int], None]  # (module path, pass, "begin"|"end", call)
MAX_NODES = 16


def leaf_label(name: str) -> str:
    """The name rows use for a module path ("" is the model itself)."""
    return name or "(model)"


def is_leaf(module: Any) -> bool:
    return not any(True for _ in module.children())


def _tensors(obj: Any) -> list[Any]:
    """The tensors in a module's arguments or output (a tensor, or a tuple/list of them)."""
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    return [obj] if hasattr(obj, "grad_fn") else []


def last_nodes(output_node: Any, input_nodes: set[Any]) -> list[Any]:
    """The module's autograd nodes with no successor among them (see module doc)."""
    seen, order, todo = {output_node}, [], [output_node]
    while todo:
        node = todo.pop()
        order.append(node)
        for nxt, _ in node.next_functions:
            if (nxt is None or nxt in input_nodes or nxt in seen
                    or type(nxt).__name__ == "AccumulateGrad"):
                continue
            if len(seen) >= MAX_NODES:
                return [output_node]
            seen.add(nxt)
            todo.append(nxt)
    return [n for n in order if not any(nxt in seen for nxt, _ in n.next_functions)]


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
        self._inputs: dict[tuple[str, int], set[Any]] = {}
        self._handles: list[Any] = []
        for label, module in modules:
            self._handles += [
                module.register_forward_pre_hook(functools.partial(self._pre, label)),
                module.register_forward_hook(functools.partial(self._post, label))]

    def _pre(self, label: str, _module: Any, args: Any) -> None:
        if not self.active:
            return
        call = self.calls.get(label, 0)
        self.calls[label] = call + 1
        self.on_boundary(label, "forward", "begin", call)
        if self.backward:
            self._inputs[label, call] = {t.grad_fn for t in _tensors(args)
                                         if t.grad_fn is not None}

    def _post(self, label: str, _module: Any, _args: Any, output: Any) -> None:
        if not self.active or label not in self.calls:
            return
        call = self.calls[label] - 1
        self.on_boundary(label, "forward", "end", call)
        if not self.backward:
            return
        inputs = self._inputs.pop((label, call), set())
        node = next((t.grad_fn for t in _tensors(output) if t.grad_fn is not None), None)
        if node is None or node in inputs:  # no gradient, or the input passed through
            return
        lasts = last_nodes(node, inputs)
        left = [len(lasts)]
        boundary = self.on_boundary

        def begin(_grads: Any) -> None:
            boundary(label, "backward", "begin", call)

        def end(_grads_in: Any, _grads_out: Any) -> None:
            left[0] -= 1
            if left[0] == 0:
                boundary(label, "backward", "end", call)

        node.register_prehook(begin)
        for last in lasts:
            last.register_hook(end)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

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
        return label

    def _global_pre(self, module: Any, args: Any) -> None:
        if self.active and is_leaf(module):
            self._pre(self._label(module), module, args)

    def _global_post(self, module: Any, args: Any, output: Any) -> None:
        if self.active and is_leaf(module):
            self._post(self._label(module), module, args, output)
