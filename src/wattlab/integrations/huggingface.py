"""Hugging Face Trainer: a callback marking training, epochs, steps and evaluations.

    from wattlab.integrations.huggingface import WattlabCallback
    trainer = Trainer(..., callbacks=[WattlabCallback()])

The Trainer calls back at the end of an evaluation only, so an evaluation is a point
marker ``evaluate`` (with its metrics' names), not a phase.
"""

from __future__ import annotations

from typing import Any

from wattlab.errors import UsageError
from wattlab.integrations import MarkFn, PhaseEmitter
from wattlab.integrations.trackers import announce_trackers

_classes: list[type] = []


def callback_class() -> type:
    """The callback class (built once, when transformers is first needed)."""
    if _classes:
        return _classes[0]
    try:
        from transformers import TrainerCallback
    except ImportError as e:
        raise UsageError(f"transformers is not installed: {e}") from e

    base: Any = TrainerCallback

    class WattlabTrainerCallback(base):
        """Phase markers from the Trainer's callback events."""

        def __init__(self, every_n_steps: int | None = None, mark: MarkFn | None = None
                     ) -> None:
            self.emitter = PhaseEmitter(every_n_steps, mark, framework="transformers")

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.emitter.begin("fit")
            report_to = getattr(args, "report_to", None) or []
            announce_trackers(getattr(args, "logging_dir", None)
                              if "tensorboard" in report_to else None, emitter=self.emitter)

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.emitter.end("fit")

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.emitter.begin("epoch", epoch=int(state.epoch or 0))

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.emitter.end("epoch")

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.emitter.step_begin(int(state.global_step))

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.emitter.step_end()

        def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            metrics = kw.get("metrics") or {}
            self.emitter.point("evaluate", step=int(state.global_step),
                               metrics=sorted(str(k) for k in metrics)[:20])

    _classes.append(WattlabTrainerCallback)
    return WattlabTrainerCallback


def WattlabCallback(every_n_steps: int | None = None, mark: MarkFn | None = None
                    ) -> Any:
    """A Trainer callback instance (a function so the import of transformers stays lazy)."""
    return callback_class()(every_n_steps, mark)
