"""PyTorch Lightning: a callback marking fit, epochs, steps, validation and test.

    from wattlab.integrations.lightning import WattlabCallback
    trainer = Trainer(callbacks=[WattlabCallback()])

Works with ``lightning.pytorch`` and the older ``pytorch_lightning`` package (whichever
the Trainer comes from: pass ``package=`` when both are installed and you use the old one).
"""

from __future__ import annotations

import importlib
from typing import Any

from wattlab.errors import UsageError
from wattlab.integrations import MarkFn, PhaseEmitter
from wattlab.integrations.trackers import announce_trackers, lightning_targets

PACKAGES = ("lightning.pytorch", "pytorch_lightning")
_classes: dict[str, type] = {}


def _callback_base(package: str | None) -> tuple[str, Any]:
    for name in (package,) if package else PACKAGES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        return name, module.Callback
    raise UsageError(f"PyTorch Lightning is not installed (tried {', '.join(PACKAGES)}): "
                     "pip install lightning")


def callback_class(package: str | None = None) -> type:
    """The callback class for one Lightning package (built once, on first use)."""
    name, found = _callback_base(package)
    base: Any = found
    if name in _classes:
        return _classes[name]

    class WattlabLightningCallback(base):
        """Phase markers from Lightning's hooks."""

        def __init__(self, every_n_steps: int | None = None, mark: MarkFn | None = None
                     ) -> None:
            super().__init__()
            self.emitter = PhaseEmitter(every_n_steps, mark, framework="lightning")

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self.emitter.begin("fit")
            announce_trackers(emitter=self.emitter,
                              extra=lightning_targets(getattr(trainer, "loggers", [])))

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            self.emitter.end("fit")

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException
                         ) -> None:
            self.emitter.close_all()

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.emitter.begin("epoch", epoch=int(trainer.current_epoch))

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.emitter.end("epoch")

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                 batch_idx: int) -> None:
            self.emitter.step_begin(int(trainer.global_step), batch=int(batch_idx))

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            self.emitter.step_end()

        def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            sanity = bool(getattr(trainer, "sanity_checking", False))
            self.emitter.begin("sanity_check" if sanity else "validation")

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            sanity = bool(getattr(trainer, "sanity_checking", False))
            self.emitter.end("sanity_check" if sanity else "validation")

        def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.emitter.begin("test")

        def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.emitter.end("test")

        def on_predict_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.emitter.begin("predict")

        def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.emitter.end("predict")

    _classes[name] = WattlabLightningCallback
    return WattlabLightningCallback


def WattlabCallback(every_n_steps: int | None = None, mark: MarkFn | None = None,
                    package: str | None = None) -> Any:
    """A Lightning callback instance (a function so the import of Lightning stays lazy)."""
    return callback_class(package)(every_n_steps, mark)
