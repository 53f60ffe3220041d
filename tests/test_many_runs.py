"""Many run files: folders, worker processes, failures per file, the tidy table export."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data_files import DATA
from wattlab.analysis.energy.source_energy import energy_report
from wattlab.analysis.many_runs import expand_runs, json_item, json_list, map_runs
from wattlab.analysis.models.sweep_results import concat, load_table
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.runfile.reader import Run

WATTLAB = [sys.executable, "-m", "wattlab.cli"]
PROFILES = DATA / "public" / "zeus" / "tests" / "profile_data"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A folder of two real recordings (different seeds) and one nested copy."""
    folder = tmp_path_factory.mktemp("runs")
    for seed in (1, 2):
        out = folder / f"seed{seed}.h5"
        done = subprocess.run([*WATTLAB, "record", "--simulate", "--seed", str(seed),
                               "--duration", "2", "--nvml-streams", "samples,power",
                               "-o", str(out)], capture_output=True, text=True, timeout=90,
                              check=False)
        assert done.returncode == 0, done.stderr
    (folder / "nested").mkdir()
    shutil.copy(folder / "seed2.h5", folder / "nested" / "copy.h5")
    (folder / "notes.txt").write_text("not a run")
    return folder


def report_of(path: Path, by_marker: bool = False) -> dict:
    with Run(str(path)) as run:
        return energy_report(run, by_marker=by_marker)


@pytest.mark.system
def test_folders_expand_to_their_run_files_at_any_depth(runs):
    assert expand_runs([str(runs)]) == [str(runs / "nested" / "copy.h5"),
                                        str(runs / "seed1.h5"), str(runs / "seed2.h5")]
    assert expand_runs([str(runs / "seed1.h5"), str(runs)])[0] == str(runs / "seed1.h5")
    with pytest.raises(UsageError, match="no such file"):
        expand_runs([str(runs / "missing.h5")])
    empty = runs / "nested" / "empty"
    empty.mkdir(exist_ok=True)
    with pytest.raises(UsageError, match="holds no run file"):
        expand_runs([str(empty)])


@pytest.mark.system
def test_energy_of_a_folder_in_two_processes_matches_each_file_alone(runs, capsys):
    assert main(["energy", str(runs), "--jobs", "2", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    paths = expand_runs([str(runs)])
    assert [r["path"] for r in reports] == paths
    for report, path in zip(reports, paths, strict=True):
        assert report["rows"] == report_of(Path(path))["rows"]
    seed1, seed2 = (reports[paths.index(str(runs / f"seed{s}.h5"))] for s in (1, 2))
    assert seed1["rows"][0]["energy_j"] != seed2["rows"][0]["energy_j"]  # really two files
    assert main(["energy", str(runs / "seed1.h5"), str(runs / "seed2.h5")]) == 0
    text = capsys.readouterr().out
    assert f"== {runs / 'seed1.h5'}" in text and f"== {runs / 'seed2.h5'}" in text


@pytest.mark.system
def test_info_of_several_files_heads_each_and_keeps_one_file_as_it_was(runs, capsys):
    one, two = str(runs / "seed1.h5"), str(runs / "seed2.h5")
    assert main(["info", one]) == 0
    alone = capsys.readouterr().out
    assert not alone.startswith("==")  # the golden snapshot's and the docs' form
    assert main(["info", one, two]) == 0
    lines = capsys.readouterr().out.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("== ")]
    assert [lines[i] for i in heads] == [f"== {one}", f"== {two}"] and heads[0] == 0
    assert "\n".join(lines[1:heads[1]]).strip() == alone.strip()
    assert main(["info", one, two, "--json"]) == 0
    assert [d["path"] for d in json.loads(capsys.readouterr().out)] == [one, two]


@pytest.mark.fast
def test_reports_encoded_in_the_workers_join_into_the_list_json_writes() -> None:
    # `energy FOLDER --json` prints the list its workers encoded item by item: it must be
    # the text json.dumps(list, indent=2) gives, nested containers and all
    results = {"a": {"x": [1, {"y": []}], "s": "q\"\n", "e": {}}, "b": [None, 2.5], "c": "t"}
    for chosen in ([], ["a"], ["a", "b", "c"]):
        items = [json_item(results.__getitem__, key) for key in chosen]
        assert json_list(items) == json.dumps([results[k] for k in chosen], indent=2)


@pytest.mark.system
def test_a_bad_file_among_many_is_named_and_the_others_still_analysed(runs, tmp_path, capsys):
    bad = tmp_path / "broken.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    code = main(["info", str(runs / "seed1.h5"), str(bad), "--jobs", "2"])
    captured = capsys.readouterr()
    assert code in (1, 2)
    assert str(bad) in captured.err and "wattlab: error:" in captured.err
    assert f"{runs / 'seed1.h5'}: wattlab run format" in captured.out


@pytest.mark.system
def test_map_runs_gives_results_in_input_order_whatever_the_jobs(runs):
    paths = expand_runs([str(runs)]) * 3
    for jobs in (1, 2):
        got = [o.path for o in map_runs(str.upper, paths, jobs)]
        assert got == paths
    with pytest.raises(UsageError, match="--jobs"):
        list(map_runs(str.upper, paths, 0))


@pytest.mark.system
def test_export_csv_and_parquet_hold_one_row_per_run_stream_and_phase(runs, tmp_path):
    pd = pytest.importorskip("pandas")
    paths = expand_runs([str(runs)])
    expected = sum(len(report_of(Path(p), by_marker=True)["rows"]) for p in paths)
    csv = tmp_path / "t.csv"
    assert main(["export", str(runs), "-o", str(csv), "--jobs", "2"]) == 0
    frame = pd.read_csv(csv)
    assert len(frame) == expected
    assert set(frame["phase"]) >= {"run", "session"}
    row = frame[(frame.run == str(runs / "seed1.h5")) & (frame.phase == "run")
                & (frame.source == "gpu0.samples")].iloc[0]
    truth = next(r for r in report_of(runs / "seed1.h5", by_marker=True)["rows"]
                 if r["phase"] == "run" and r["source"] == "gpu0.samples")
    assert row.energy_j == pytest.approx(truth["energy_j"], rel=1e-12)
    assert row.model == "Simulated H100 80GB HBM3" and row.kind == "nvml"
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (the parquet extra)")
    parquet = tmp_path / "t.parquet"
    assert main(["export", str(runs), "-o", str(parquet)]) == 0
    typed = pd.read_parquet(parquet)
    assert len(typed) == expected and typed["energy_j"].dtype == "float64"
    assert typed["gaps"].dtype == "int64"
    assert typed.sort_values(["run", "source", "channel", "phase"])["energy_j"].tolist() == \
        pytest.approx(frame.sort_values(["run", "source", "channel", "phase"])
                      ["energy_j"].tolist())


@pytest.mark.system
@pytest.mark.parametrize("reader", ["polars", "duckdb"])
def test_polars_and_duckdb_read_the_exports_directly(runs, tmp_path, reader):
    module = pytest.importorskip(reader, reason=f"{reader} is not installed")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (the parquet extra)")
    for suffix in ("csv", "parquet"):
        out = tmp_path / f"t.{suffix}"
        assert main(["export", str(runs / "seed1.h5"), "-o", str(out)]) == 0
        if reader == "polars":
            frame = module.read_csv(out) if suffix == "csv" else module.read_parquet(out)
            total = frame.filter(module.col("phase") == "run")["energy_j"].sum()
        else:
            total = module.sql(f"SELECT sum(energy_j) FROM '{out}' WHERE phase = 'run'"
                               ).fetchall()[0][0]
        truth = sum(r["energy_j"] or 0 for r in report_of(runs / "seed1.h5")["rows"])
        assert total == pytest.approx(truth)


@pytest.mark.system
def test_export_refuses_to_overwrite_and_needs_a_format(runs, tmp_path, capsys):
    out = tmp_path / "t.csv"
    out.write_text("keep me")
    assert main(["export", str(runs), "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert out.read_text() == "keep me"
    assert main(["export", str(runs), "-o", str(tmp_path / "t.xlsx")]) == 2
    assert "--format csv or --format parquet" in capsys.readouterr().err


@pytest.mark.system
def test_fit_reads_several_tables_in_parallel_as_one(capsys):
    files = [PROFILES / "A40+resnet18+gpu0.csv", PROFILES / "A40+resnet50+gpu0.csv"]
    assert main(["fit", *map(str, files), "--jobs", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    joined = concat([load_table(str(f)) for f in files])
    assert report["n_rows"] == len(joined)
    assert report["n_workloads"] == 2
