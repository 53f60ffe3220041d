"""A marker phase per leaf module, forward and backward, on the GPU's execution time.

    from wattlab.integrations.layer_marks import mark_layers
    marks = mark_layers(model, every_n_steps=50)   # or `wattlab record --auto-markers=layers`

Each leaf module's forward and backward become a phase ``<module>:forward`` /
``<module>:backward`` (payload: layer, pass, step), its ends taken at the module's
boundaries (integrations.layer_hooks, the hooks `wattlab layers` times layers with) and
stamped with CUDA events (gpu_marks), so they line up with the GPU's execution, not the
host's launches. One step of a ResNet50 is ~320 phases, so only every ``every_n_steps``-th
step is marked (steps counted by optimizer steps; env ``WATTLAB_LAYER_EVERY``, default
100); other steps' hooks return at once.
"""

from __future__ import annotations

from typing import Any

from wattlab.errors import UsageError
from wattlab.integrations import PhaseEmitter
from wattlab.integrations import every_from_env as step_every_from_env
from wattlab.integrations.layer_hooks import BoundaryHooks, GlobalBoundaryHooks, hook_leaves

EVERY_ENV = "WATTLAB_LAYER_EVERY"
DEFAULT_EVERY = 100


def every_from_env() -> int:
    """Layer-marker thinning from ``WATTLAB_LAYER_EVERY`` (every Nth step, N >= 1)."""
    return step_every_from_env(DEFAULT_EVERY, EVERY_ENV, least=1)


class LayerMarks:
    """Phases per leaf module on every n-th step (see module doc); ``remove()`` undoes it."""

    def __init__(self, model: Any = None, every_n_steps: int | None = None,
                 emitter: PhaseEmitter | None = None) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.every_n_steps = every_from_env() if every_n_steps is None else every_n_steps
        if self.every_n_steps < 1:
            raise UsageError(f"every_n_steps must be >= 1, got {self.every_n_steps}")
        self.emitter = emitter or PhaseEmitter(framework="torch")
        self.step = 0
        self.phases = 0
        self._open: dict[tuple[str, str, int], Any] = {}
        self.hooks: BoundaryHooks = (GlobalBoundaryHooks(self._boundary) if model is None
                                     else hook_leaves(model, self._boundary))
        self._step_hook = register_optimizer_step_post_hook(self._after_step)

    def _boundary(self, label: str, pass_name: str, edge: str, call: int) -> None:
        key = (label, pass_name, call)
        if edge == "begin":
            self._open[key] = self.emitter.stamp()
            return
        start = self._open.pop(key, None)
        if start is not None:
            self.emitter.span(f"{label}:{pass_name}", start, self.emitter.stamp(),
                              layer=label, **{"pass": pass_name, "step": self.step})
            self.phases += 1

    def _after_step(self, *_args: Any) -> None:
        self.step += 1
        self._open.clear()  # a begin with no end (a step cut short) is dropped
        self.hooks.calls.clear()
        self.hooks.active = self.step % self.every_n_steps == 0

    def remove(self) -> None:
        self.hooks.remove()
        self._step_hook.remove()


def mark_layers(model: Any = None, every_n_steps: int | None = None,
                emitter: PhaseEmitter | None = None) -> LayerMarks:
    """Mark every leaf module of ``model`` (all models when None) on every n-th step."""
    return LayerMarks(model, every_n_steps, emitter)
