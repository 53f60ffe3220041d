"""Phase markers from training frameworks: epoch, step, validation, with no manual marks.

Each framework module imports its framework only when used, so ``import wattlab`` never
pulls in torch, keras or transformers. All of them go through one ``PhaseEmitter`` that
keeps begin/end pairs balanced (a crash inside an epoch still closes it) and can thin out
step markers for very fast loops (``every_n_steps``; env ``WATTLAB_MARK_EVERY``).

Outside a wattlab session (no ``WATTLAB_BUS``) every marker is a silent no-op.

In a process that runs CUDA through PyTorch every marker also carries the GPU's execution
time of that boundary (a CUDA event, resolved off the training path: ``gpu_marks``): a
callback fires when the host has queued a step, long before the GPU has run it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from wattlab.errors import UsageError

MarkFn = Callable[..., None]
EVERY_ENV = "WATTLAB_MARK_EVERY"


def every_from_env(default: int = 1, name: str = EVERY_ENV, least: int = 0) -> int:
    """Step thinning from an environment variable; unset or empty gives ``default``.

    ``WATTLAB_MARK_EVERY`` (the default name): 0 turns step markers off.
    """
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError as e:
        raise UsageError(f"{name}={text!r} is not a whole number") from e
    if value < least:
        raise UsageError(f"{name}={text!r} must be >= {least}")
    return value


def _default_mark(name: str, kind: str = "point", **payload: Any) -> None:
    from wattlab.acquisition.markers import mark

    mark(name, kind, **payload)


def _default_stamp() -> Any:
    from wattlab.acquisition.markers import take_stamp

    return take_stamp()


class PhaseEmitter:
    """Begin/end markers with bookkeeping; ``mark`` is injectable for tests."""

    def __init__(self, every_n_steps: int | None = None, mark: MarkFn | None = None,
                 framework: str = "", stamp: Callable[[], Any] | None = None) -> None:
        every = every_from_env() if every_n_steps is None else every_n_steps
        if every < 0:
            raise UsageError(f"every_n_steps must be >= 0, got {every}")
        self.every_n_steps = every
        self.framework = framework
        self._mark = mark or _default_mark
        self.stamp = stamp or _default_stamp
        self._open: list[str] = []

    def begin(self, name: str, **payload: Any) -> None:
        if self.framework:
            payload.setdefault("framework", self.framework)
        self._mark(name, "begin", **payload)
        self._open.append(name)

    def end(self, name: str) -> None:
        """End the innermost open phase ``name`` (and any phase left open inside it)."""
        if name not in self._open:
            return
        while self._open:
            inner = self._open.pop()
            self._mark(inner, "end")
            if inner == name:
                return

    def point(self, name: str, *, at: Any = None, **payload: Any) -> None:
        if at is not None:
            payload["at"] = at
        self._mark(name, "point", **payload)

    def span(self, name: str, start: Any, end: Any, **payload: Any) -> None:
        """A whole phase between two boundaries taken earlier with ``stamp()``.

        Why: some boundaries are known only afterwards (plain PyTorch: a step ends at one
        optimizer step and began at the previous one).
        """
        if self.framework:
            payload.setdefault("framework", self.framework)
        self._mark(name, "begin", at=start, **payload)
        self._mark(name, "end", at=end)

    def wants_step(self, step: int) -> bool:
        return self.every_n_steps > 0 and step % self.every_n_steps == 0

    def step_begin(self, step: int, name: str = "step", **payload: Any) -> None:
        if self.wants_step(step):
            self.begin(name, step=step, **payload)

    def step_end(self, name: str = "step") -> None:
        if self._open and self._open[-1] == name:
            self.end(name)

    def close_all(self) -> None:
        """End every open phase, innermost first (training ended or failed)."""
        while self._open:
            self._mark(self._open.pop(), "end")

    @property
    def open_phases(self) -> list[str]:
        return list(self._open)


__all__ = ["EVERY_ENV", "PhaseEmitter", "every_from_env"]
