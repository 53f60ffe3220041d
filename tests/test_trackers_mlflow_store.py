"""`wattlab log --to mlflow` against the stores the `trackers` extra (mlflow-skinny) has.

docs/trackers.md's `--tracking-uri sqlite:///mlflow.db` (no SQL store in mlflow-skinny),
the default `./mlruns` file store (MLflow 3 refuses it without `MLFLOW_ALLOW_FILE_STORE`)
and an unknown run id were three tracebacks (issue 38). A run in a file store now gets the
energy; the others are one line naming the URI or the run, and exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data_files import data_file
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.integrations.trackers import Metric, log_mlflow

METRICS = [Metric("energy/epoch_j", 5.5, 0, 1_000), Metric("energy/epoch_j", 7.25, 1, 2_000)]


@pytest.fixture
def file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(tracking URI, run id) of a run made in a file store, as a training script would."""
    pytest.importorskip("mlflow", reason="mlflow not installed (the trackers extra)")
    from mlflow.store.tracking.file_store import FileStore

    root = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the script's own opt-in
    # the store itself, not a client: MLflow caches a client's store by URI, and the
    # command must open its own, as it does in a process of its own
    run_id = FileStore(str(root)).create_run("0", "", 0, [], "train").info.run_id
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # wattlab log runs without it
    return f"file://{root}", run_id


@pytest.mark.system
def test_a_run_in_a_file_store_gets_the_energy_without_the_opt_in(file_store) -> None:
    from mlflow.tracking import MlflowClient

    uri, run_id = file_store
    assert log_mlflow(METRICS, run_id, uri) == run_id
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "energy/epoch_j")
    assert {m.step: m.value for m in history} == {0: 5.5, 1: 7.25}


@pytest.mark.system
def test_an_unknown_run_id_is_one_line_naming_it_and_the_store(file_store) -> None:
    uri, _ = file_store
    with pytest.raises(UsageError) as caught:
        log_mlflow(METRICS, "3f2a", uri)
    assert str(caught.value) == (f"MLflow: no run '3f2a' in the store at {uri}: give the id of "
                                 "a run in that store (--run-id), or the store it is in "
                                 "(--tracking-uri)")


@pytest.mark.system
def test_a_sql_store_without_its_package_says_what_to_install(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="mlflow not installed (the trackers extra)")
    try:
        import sqlalchemy  # noqa: F401  (the full mlflow package's SQL store)
    except ImportError:
        pass
    else:
        pytest.skip("the full mlflow package is installed: its SQL store works")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(UsageError, match=r"^MLflow: the store at sqlite:///.* needs the full "
                                         r"mlflow package \(pip install mlflow\); "):
        log_mlflow(METRICS, "3f2a", uri)


@pytest.mark.system
def test_cli_unknown_run_is_exit_2_without_a_traceback(file_store,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    uri, _ = file_store
    assert main(["log", str(data_file("demo/demo24.h5")), "--to", "mlflow", "--run-id", "nope",
                 "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wattlab: error: MLflow: no run 'nope'") and "Traceback" not in err
