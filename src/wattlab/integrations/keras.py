"""Keras 3: a callback marking fit, epochs, steps, validation and predict.

    from wattlab.integrations.keras import WattlabCallback
    model.fit(x, y, callbacks=[WattlabCallback()])

Any Keras 3 backend (TensorFlow, JAX, PyTorch); Keras is imported on first use only.
"""

from __future__ import annotations

from typing import Any

from wattlab.errors import UsageError
from wattlab.integrations import MarkFn, PhaseEmitter
from wattlab.integrations.trackers import announce_trackers

_classes: list[type] = []


def callback_class() -> type:
    """The callback class (built once, when Keras is first needed)."""
    if _classes:
        return _classes[0]
    try:
        import keras
    except ImportError as e:
        raise UsageError(f"Keras is not installed or has no backend: {e}") from e

    base: Any = keras.callbacks.Callback

    class WattlabKerasCallback(base):
        """Phase markers from Keras' callback hooks."""

        def __init__(self, every_n_steps: int | None = None, mark: MarkFn | None = None
                     ) -> None:
            super().__init__()
            self.emitter = PhaseEmitter(every_n_steps, mark, framework="keras")
            self._step = 0
            self._in_fit = False

        def on_train_begin(self, logs: Any = None) -> None:
            self._in_fit = True
            self.emitter.begin("fit")
            announce_trackers(emitter=self.emitter)

        def on_train_end(self, logs: Any = None) -> None:
            self._in_fit = False
            self.emitter.end("fit")

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.emitter.begin("epoch", epoch=int(epoch))

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.emitter.end("epoch")

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.emitter.step_begin(self._step, batch=int(batch))
            self._step += 1

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.emitter.step_end()

        def on_test_begin(self, logs: Any = None) -> None:
            self.emitter.begin("validation" if self._in_fit else "evaluate")

        def on_test_end(self, logs: Any = None) -> None:
            self.emitter.end("validation" if self._in_fit else "evaluate")

        def on_predict_begin(self, logs: Any = None) -> None:
            self.emitter.begin("predict")

        def on_predict_end(self, logs: Any = None) -> None:
            self.emitter.end("predict")

    _classes.append(WattlabKerasCallback)
    return WattlabKerasCallback


def WattlabCallback(every_n_steps: int | None = None, mark: MarkFn | None = None
                    ) -> Any:
    """A Keras callback instance (a function so the import of Keras stays lazy)."""
    return callback_class()(every_n_steps, mark)
