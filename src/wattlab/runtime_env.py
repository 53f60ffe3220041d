"""Keep wattlab's own processes light without touching the workload's environment.

numpy's BLAS starts one spinning thread per core at import; on a 16-core GPU node that
costs seconds of CPU in every wattlab process for nothing (wattlab does no matrix
algebra). wattlab pins them to one thread for itself, and hands the measured command
the environment exactly as the user had it.
"""

from __future__ import annotations

import os

MATH_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_user_values: dict[str, str | None] = {}


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
