"""Opening the MLflow store a run is in, with what the ``trackers`` extra installs.

Why: the extra installs mlflow-skinny, which has no SQL store (MLflow 3's default
``sqlite:///mlflow.db``), and MLflow 3 refuses its file store (``./mlruns``) unless
``MLFLOW_ALLOW_FILE_STORE`` is set. A run a training script made in a file store already
lives there, so adding its energy is no new use of that store: the opt-in is given for
wattlab's call alone. Whatever MLflow still refuses (a SQL store without its package, a
run id not in the store) is one line naming the store and what to give, never a traceback.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

from wattlab.errors import UsageError

FILE_STORE_OPT_IN = "MLFLOW_ALLOW_FILE_STORE"
SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def _scheme(uri: str) -> str:
    return urlparse(uri).scheme.partition("+")[0].lower()


def check_store(uri: str) -> None:
    """Refuse, in one line, a store the installed MLflow cannot open (a SQL one in skinny)."""
    if _scheme(uri) in SQL_SCHEMES and importlib.util.find_spec("sqlalchemy") is None:
        raise UsageError(f"MLflow: the store at {uri} needs the full mlflow package (pip "
                         "install mlflow); mlflow-skinny, the trackers extra, has no SQL "
                         "store: name a file store (--tracking-uri file:./mlruns) or a "
                         "tracking server (--tracking-uri http://HOST:5000)")


@contextmanager
def opened(uri: str, run_id: str) -> Iterator[None]:
    """Around MLflow calls on run ``run_id`` in the store at ``uri``.

    A file store gets the opt-in for their time; MLflow's refusals become one line each.
    """
    from mlflow.exceptions import MlflowException

    check_store(uri)
    before = os.environ.get(FILE_STORE_OPT_IN)
    if _scheme(uri) in ("", "file") and before is None:
        os.environ[FILE_STORE_OPT_IN] = "true"
    try:
        yield
    except MlflowException as e:
        raise UsageError(_refusal(e, uri, run_id)) from e
    finally:
        if before is None:
            os.environ.pop(FILE_STORE_OPT_IN, None)


def _refusal(error: Any, uri: str, run_id: str) -> str:
    if getattr(error, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
        return (f"MLflow: no run {run_id!r} in the store at {uri}: give the id of a run in "
                "that store (--run-id), or the store it is in (--tracking-uri)")
    first = str(getattr(error, "message", error)).strip().splitlines()[0]
    return f"MLflow: the store at {uri} refused: {first}"
