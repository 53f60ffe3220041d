"""Keep wattlab's own processes light without touching the workload's environment.

numpy's BLAS starts one spinning thread per core at import; on a 16-core GPU node that
costs seconds of CPU in every wattlab process for nothing (wattlab does no matrix
algebra). wattlab pins them to one thread for itself, and hands the measured command
the environment exactly as the user had it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

MATH_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_user_values: dict[str, str | None] = {}
# ``--auto-markers``: a folder with a sitecustomize.py put first on the workload's PYTHONPATH
# (its hook is wattlab.integrations.auto_markers; a path, not an import, so a session stays
# below the integrations)
AUTO_ENV = "WATTLAB_AUTO_MARKERS"
LAYERS_ENV = "WATTLAB_AUTO_LAYERS"  # also a phase per leaf module (--auto-markers=layers)
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "integrations", "_site")


def quiet_math_threads() -> None:
    """Call before numpy is imported; remembers what the user had."""
    for name in MATH_THREAD_VARS:
        if name not in _user_values:
            _user_values[name] = os.environ.get(name)
        os.environ.setdefault(name, "1")


def workload_environ(**extra: str) -> dict[str, str]:
    """The environment for the measured command: the user's own, plus ``extra``."""
    env = dict(os.environ)
    for name, value in _user_values.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env.update(extra)
    return env


def auto_marker_env(env: Mapping[str, str], mode: str = "steps") -> dict[str, str]:
    """Environment additions that make a Python workload install auto-markers.

    ``mode`` "layers" adds a phase per leaf module (integrations.layer_marks) in torch.
    """
    existing = env.get("PYTHONPATH", "")
    path = SITE_DIR if not existing else SITE_DIR + os.pathsep + existing
    extra = {"PYTHONPATH": path, AUTO_ENV: "1"}
    if mode == "layers":
        extra[LAYERS_ENV] = "1"
    return extra
