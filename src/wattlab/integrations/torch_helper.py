"""Plain PyTorch: wrap the epoch and batch loops, or hook every optimizer step.

    from wattlab.integrations.torch_helper import epochs, steps, validation
    for epoch in epochs(10):
        for batch in steps(loader):
            ...                      # one "step" phase per loop body
        with validation():
            ...

A step phase covers the loop body only, so the time the loader spends fetching the next
batch stays outside it (and shows up between steps). ``torch`` is imported only by
``mark_optimizer_steps``; the loop wrappers work with any iterable.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from wattlab.integrations import PhaseEmitter

T = TypeVar("T")


def epochs(count_or_iterable: int | Iterable[T], name: str = "epoch", *,
           emitter: PhaseEmitter | None = None) -> Iterator[Any]:
    """Yield epochs (``range(n)`` for an int), each inside an ``epoch`` phase."""
    em = emitter or PhaseEmitter(framework="torch")
    items: Iterable[Any] = (range(count_or_iterable) if isinstance(count_or_iterable, int)
                            else count_or_iterable)
    for index, item in enumerate(items):
        em.begin(name, epoch=index)
        try:
            yield item
        finally:
            em.end(name)


def steps(iterable: Iterable[T], name: str = "step", *, every_n_steps: int | None = None,
          emitter: PhaseEmitter | None = None) -> Iterator[T]:
    """Yield batches, each loop body inside a ``step`` phase (every n-th one if asked)."""
    em = emitter or PhaseEmitter(every_n_steps, framework="torch")
    for index, item in enumerate(iterable):
        em.step_begin(index, name)
        try:
            yield item
        finally:
            em.step_end(name)


@contextmanager
def validation(name: str = "validation", *, emitter: PhaseEmitter | None = None,
               **payload: Any) -> Iterator[None]:
    """A ``validation`` phase (the end is marked even if the body raises)."""
    em = emitter or PhaseEmitter(framework="torch")
    em.begin(name, **payload)
    try:
        yield
    finally:
        em.end(name)


class OptimizerStepMarks:
    """Markers at every n-th ``optimizer.step()`` of any optimizer (a global hook).

    A point marker, and a ``step`` phase from the previous optimizer step to this one.

    Why the phase: an unmodified loop shows its steps only through the optimizer, so one
    step of training lies between two optimizer steps; in a CUDA program both ends are the
    GPU's times, so the phase holds the step's energy. The work before the first optimizer
    step (warm-up) is in no step.
    """

    def __init__(self, every_n_steps: int | None = None, name: str = "optimizer_step",
                 emitter: PhaseEmitter | None = None) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.name = name
        self.emitter = emitter or PhaseEmitter(every_n_steps, framework="torch")
        self.count = 0
        self.enabled = True
        self._previous: Any = None  # the boundary the next step phase begins at
        self._handle = register_optimizer_step_post_hook(self._after_step)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        step, self.count = self.count, self.count + 1
        if not self.enabled:
            self._previous = None
            return
        wanted, follows = self.emitter.wants_step(step), self.emitter.wants_step(step + 1)
        if not (wanted or follows or self._previous is not None):
            return
        now = self.emitter.stamp()
        if self._previous is not None:
            self.emitter.span("step", self._previous, now, step=step)
        self._previous = now if follows else None
        if wanted:
            self.emitter.point(self.name, at=now, step=step)

    def remove(self) -> None:
        self._handle.remove()


def mark_optimizer_steps(every_n_steps: int | None = None, name: str = "optimizer_step",
                         emitter: PhaseEmitter | None = None) -> OptimizerStepMarks:
    """Mark optimizer steps with no change to the training loop; ``.remove()`` undoes it."""
    return OptimizerStepMarks(every_n_steps, name, emitter)
