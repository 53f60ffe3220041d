"""Phase markers in unmodified training code: `wattlab record --auto-markers -- python train.py`.

The session puts a folder holding a ``sitecustomize.py`` first on the workload's
PYTHONPATH (``wattlab.runtime_env.auto_marker_env``). Python imports it at start-up; it
calls ``install()``, which adds an import hook: when the program itself imports Keras, Lightning,
the Hugging Face Trainer or torch, the hook adds wattlab's callback (to ``Model.fit``, the
``Trainer`` constructor) or a global optimizer-step hook. Nothing is imported that the
program does not import, and a failure here prints one warning and never stops the
program. A user's own ``sitecustomize`` still runs (it is chained).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from wattlab.runtime_env import LAYERS_ENV

Hook = Callable[[ModuleType], None]


class _State:
    """What was installed in this process (one of each, whatever imports happen)."""

    framework_callback = False
    torch_marks: Any = None
    patched: set[str] = set()
    lock = threading.Lock()


def _warn(what: str, error: BaseException) -> None:
    print(f"wattlab: auto-markers: {what}: {type(error).__name__}: {error}", file=sys.stderr)


def _framework_active() -> None:
    """A framework callback marks steps now; plain optimizer-step points would double them."""
    _State.framework_callback = True
    if _State.torch_marks is not None:
        _State.torch_marks.enabled = False


def _with_callback(callbacks: Any, cls: type) -> list[Any]:
    items = [] if callbacks is None else (list(callbacks) if isinstance(callbacks, list | tuple)
                                          else [callbacks])
    if not any(isinstance(c, cls) for c in items):
        items.append(cls())
        _framework_active()
    return items


def patch_keras(module: Any) -> None:
    """``Model.fit/evaluate/predict`` get wattlab's Keras callback unless one is passed."""
    from wattlab.integrations.keras import callback_class

    cls = callback_class()
    model = module.Model
    for method in ("fit", "evaluate", "predict"):
        original = getattr(model, method)

        @functools.wraps(original)
        def wrapper(self: Any, *args: Any, _original: Any = original, **kw: Any) -> Any:
            kw["callbacks"] = _with_callback(kw.get("callbacks"), cls)
            return _original(self, *args, **kw)

        setattr(model, method, wrapper)


def patch_lightning(module: Any) -> None:
    """``Trainer(...)`` gets wattlab's Lightning callback unless one is passed."""
    from wattlab.integrations.lightning import callback_class

    package = module.__name__ if module.__name__ in ("lightning.pytorch", "pytorch_lightning") \
        else None
    cls = callback_class(package)
    trainer = module.Trainer
    original = trainer.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kw: Any) -> None:
        kw["callbacks"] = _with_callback(kw.get("callbacks"), cls)
        original(self, *args, **kw)

    trainer.__init__ = init


def patch_transformers(module: Any) -> None:
    """The Hugging Face ``Trainer`` adds wattlab's callback after it is built."""
    from wattlab.integrations.huggingface import callback_class

    cls = callback_class()
    trainer = module.Trainer
    original = trainer.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kw: Any) -> None:
        original(self, *args, **kw)
        if not any(isinstance(c, cls) for c in self.callback_handler.callbacks):
            self.add_callback(cls())
            _framework_active()

    trainer.__init__ = init


def patch_torch(module: Any) -> None:
    """Plain PyTorch: a point marker per optimizer step (off once a framework marks steps)."""
    from wattlab.integrations.torch_helper import mark_optimizer_steps

    marks = mark_optimizer_steps()
    marks.enabled = not _State.framework_callback
    _State.torch_marks = marks
    if os.environ.get(LAYERS_ENV) == "1":
        from wattlab.integrations.layer_marks import mark_layers

        mark_layers()


HOOKS: dict[str, Hook] = {
    "keras": patch_keras,
    "lightning.pytorch": patch_lightning,
    "pytorch_lightning": patch_lightning,
    "transformers.trainer": patch_transformers,
    "torch": patch_torch,
}


def _run_hook(name: str, module: ModuleType) -> None:
    with _State.lock:
        if name in _State.patched:
            return
        _State.patched.add(name)
    try:
        HOOKS[name](module)
    except Exception as e:  # never break the user's program over a marker
        _warn(f"could not instrument {name}", e)


class _HookedLoader(importlib.abc.Loader):
    """Runs the real loader, then the hook, once the module has finished executing."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run_hook(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds hooked modules through the other finders and wraps their loader."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in HOOKS or fullname in self._busy or fullname in _State.patched:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


_finder: _PostImportFinder | None = None


def install() -> None:
    """Instrument frameworks as the program imports them (and those already imported)."""
    global _finder  # noqa: PLW0603
    if _finder is None:
        _finder = _PostImportFinder()
        sys.meta_path.insert(0, _finder)
    for name in HOOKS:
        module = sys.modules.get(name)
        if module is not None:
            _run_hook(name, module)
