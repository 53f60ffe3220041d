"""What `wattlab layers MODEL` runs: the model, its input shape and dtype.

Why a module of its own: the CLI, the benchmarks and the tests all build a model from a
torchvision name or a ``module:callable`` and must refuse bad input the same way.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from wattlab.errors import UsageError

DTYPES = ("float32", "float16", "bfloat16")


def import_torch() -> Any:
    """torch, or a UsageError naming the extra that installs it."""
    try:
        import torch
    except ImportError as e:
        raise UsageError("wattlab layers needs PyTorch: pip install 'wattlab[layers]'") from e
    return torch


def parse_shape(text: str) -> tuple[int, ...]:
    """``1x3x224x224`` -> (1, 3, 224, 224); every size a positive integer."""
    if not re.fullmatch(r"\d+(x\d+)*", text.strip()):
        raise UsageError(f"--input {text!r}: write sizes joined by x, e.g. 1x3x224x224")
    shape = tuple(int(s) for s in text.strip().split("x"))
    if any(s <= 0 for s in shape):
        raise UsageError(f"--input {text!r}: every size must be >= 1")
    return shape


def with_batch(shape: tuple[int, ...], batch: int | None) -> tuple[int, ...]:
    """The input shape with its first size replaced by ``batch`` (when given)."""
    if batch is None:
        return shape
    if batch <= 0:
        raise UsageError(f"--batch must be >= 1, got {batch}")
    return (batch, *shape[1:])


def torch_dtype(name: str) -> Any:
    if name not in DTYPES:
        raise UsageError(f"--dtype {name!r}: choose from {', '.join(DTYPES)}")
    return getattr(import_torch(), name)


def load_model(spec: str) -> Any:
    """An ``nn.Module`` from a torchvision model name or ``package.module:callable``."""
    torch = import_torch()
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise UsageError(f"model {spec!r}: cannot import {attr!r} from {mod_name!r}: {e}"
                             ) from e
        model = factory() if callable(factory) and not isinstance(factory, torch.nn.Module) \
            else factory
    else:
        try:
            import torchvision
        except ImportError as e:
            raise UsageError(f"model {spec!r}: torchvision names need torchvision importable "
                             f"({e}); or give module:callable") from e
        try:
            model = torchvision.models.get_model(spec, weights=None)
        except ValueError as e:
            raise UsageError(f"model {spec!r}: not a torchvision model name ({e})") from e
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"model {spec!r}: gave a {type(model).__name__}, not an nn.Module")
    return model
