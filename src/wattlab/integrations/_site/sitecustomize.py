"""Imported by Python at start-up when wattlab's auto-markers folder is on PYTHONPATH.

It installs wattlab's framework hooks (only if ``WATTLAB_AUTO_MARKERS=1``), then runs
the ``sitecustomize`` this one shadows, if any, so a site's own start-up code still runs.
"""

from __future__ import annotations

import importlib
import os
import sys


def _install() -> None:
    if os.environ.get("WATTLAB_AUTO_MARKERS") != "1":
        return
    try:
        from wattlab.integrations.auto_markers import install
    except Exception as e:  # wattlab missing in this interpreter: say so, run anyway
        print(f"wattlab: auto-markers off in {sys.executable}: {e}", file=sys.stderr)
        return
    install()


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    ours = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved


_install()
_chain()
