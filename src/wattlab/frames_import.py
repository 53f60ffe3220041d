"""pandas and xarray, the ``frames`` extra, imported where a table is asked for.

Why: the core install leaves them out, and Python's bare ``No module named 'pandas'``
does not say that one extra brings both. The error stays a ``ModuleNotFoundError`` (code
that catches ``ImportError`` still does) and names what asked and what to install.
"""

from __future__ import annotations

import importlib
from typing import Any

FRAMES_INSTALL = ("pip install 'wattlab[frames]' (pandas and xarray; from a checkout: "
                  "pip install -e '.[frames]')")


def frames_module(name: str, wanted_by: str) -> Any:
    """``pandas`` or ``xarray``, or an error naming ``wanted_by`` and the extra."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ModuleNotFoundError(f"{wanted_by} needs {name}, which is not installed: "
                                  f"{FRAMES_INSTALL}", name=name) from e
