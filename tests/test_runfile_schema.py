"""runfile/schema.py is the one declaration of the run-file format.

Three checks, each with planted drift that shows it can fail:
(a) outside src/wattlab/runfile/ no module spells a run-file name as a string literal: it
    imports the name from ``wattlab.runfile.schema``;
(b) docs/run-file.md names exactly what the schema declares, and the table fields' types;
(c) a file made by the writer and the record writers has exactly the schema's layout, and
    the recorded files kept in tests/data hold nothing the schema leaves out.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import fields, replace
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.data_files import DATA
from wattlab.analysis.attribution import parse_request_log, write_requests
from wattlab.analysis.calibration.stream_calibration import WIDTH_NAME, store_in_run
from wattlab.runfile import (
    CalibrationRecord,
    CalibrationValidity,
    Estimate,
    FittedParams,
    TargetStream,
    read_calibrations,
    schema,
)
from wattlab.runfile.layers_parts import RooflineLimits
from wattlab.runfile.layers_record import LayersRecord, write_layers
from wattlab.runfile.tuning_record import (
    TuningIterations,
    TuningProbes,
    TuningRecord,
    write_tuning,
)
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Gap, Marker, SourceDescriptor
from wattlab.sync.clock_service import ClockProbe, ClockTracker

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "wattlab"
DOC = ROOT / "docs" / "run-file.md"
RECORDED = sorted((ROOT / "tests" / "data").glob("*/*.h5"))

# ---------------------------------------------------------------- (a) names in the source

WORD = ("a common word: a literal of it outside runfile/ is nearly always something else "
        "(a key of a command's JSON output, a descriptor or plan field, an export column)")
GROUP = ("a group or table name that is also a common word: searched inside path literals "
         "only ('/markers', 'analysis/tuning'), see PATH_PARTS")
CLOCK_FIT = ("a field of the clock fit, named by device_models.clock_fit (below runfile, so "
             "it cannot import the schema); the writer stores ClockFit.to_attrs() as it is")
CALIBRATION = ("a key of the calibration record's JSON, which calibrate() makes and its "
               "readers read; the stored group repeats it as an attribute")
LEFT_OUT: dict[str, str] = {
    **dict.fromkeys(("time", "values", "name", "kind", "model", "serial", "firmware",
                     "transport", "host", "source", "rows", "ended", "reason", "unit",
                     "units", "meaning", "meanings", "created", "command", "probe", "probes",
                     "purpose", "used", "iterations", "knobs", "windows", "window_s",
                     "start_ns", "end_ns", "energy_j", "energy_se_j", "time_s", "time_se_s",
                     "id", "log", "format", "skipped", "mapping", "start_s", "end_s",
                     "first_token_s", "prompt_tokens", "output_tokens"),
                    WORD),
    **dict.fromkeys(("sources", "markers", "gaps", "sync", "analysis", "calibration",
                     "layers", "tuning", "requests"), GROUP),
    **dict.fromkeys(("method", "device_ref", "host_ref_ns", "ns_per_unit",
                     "nominal_ns_per_unit", "drift_ppm", "n_points", "residual_p50_ns",
                     "residual_p99_ns", "residual_max_ns"), CLOCK_FIT),
    **dict.fromkeys(("kernel", "identifiable", "tau_s", "w_s", "time_constant_s", "gain",
                     "offset_w"), CALIBRATION),
    "iteration_source": "a key of the tuner's summary JSON, which the tuning group repeats",
    "bench_config": "also the Session parameter that carries it (commands/record.py)",
    "imported_from": "also a key of an imported stream's descriptor config",
    "import_format": "also a key of an imported stream's descriptor config",
}
"""Schema names not searched as whole literals, and why."""
SEARCHED = frozenset(schema.NAMES) - LEFT_OUT.keys()
PATH_PARTS = frozenset(part for node in schema.LAYOUT for part in node.path.split("/")
                       if part and not part.startswith("<"))
"""Group, table and dataset names: found in any literal that looks like a path in a file."""

BUS = "the bus messages (sync/bus): a wire format of its own that shares these words"
EXEMPT: dict[tuple[str, str], str] = {
    **dict.fromkeys([("sync/bus/message.py", n) for n in (
        "flags", "payload", "seq_first", "seq_last", "samples_lost")], BUS),
    ("sync/bus/publisher.py", "seq_next"): BUS,
    ("sync/recorder/status.py", "samples_lost"): "a key of the recorder's status reply",
    ("sync/recorder/process.py", "config_json"): "the recorder's command-line argument",
    ("samples.py", "time_raw"): "SourceDescriptor's field (the stream attribute copies it)",
    ("samples.py", "flags"): "a SampleBatch buffer (the dataset is named after it)",
    ("commands/import_data.py", "time_unit"): "the CSV importer's option",
    ("analysis/models/sweep_results.py", "format_version"): "the sweep file's own layout",
}
"""(module under src/wattlab, name): a literal that is not a run-file name there, and why."""


def string_literals(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string constant but documentation (comments are not in the AST).

    Documentation: a string that is a statement of its own (docstrings, and the strings
    written after a constant to describe it).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                id(node) not in prose):
            yield node.lineno, node.value


def names_in(text: str) -> set[str]:
    """The run-file names a literal spells: as a whole, or as a part of a path."""
    found = {text} & SEARCHED
    if "/" in text and not re.search(r"\s|://", text):
        found |= set(text.split("/")) & PATH_PARTS
    return found


@functools.cache
def literal_names(src: Path) -> tuple[tuple[str, int, str], ...]:
    """(module, line, name) of every run-file name spelled outside ``src/runfile``."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(src.rglob("*.py")):
        module = path.relative_to(src).as_posix()
        if not module.startswith("runfile/"):
            found += [(module, line, name) for line, text in string_literals(path)
                      for name in sorted(names_in(text))]
    return tuple(found)


def spelled_names(src: Path, exempt: Mapping[tuple[str, str], str]) -> list[str]:
    """``module:line: name`` for each of those but the exempt."""
    return [f"{module}:{line}: {name}" for module, line, name in literal_names(src)
            if (module, name) not in exempt]


@pytest.mark.system
def test_no_module_outside_runfile_spells_a_run_file_name() -> None:
    assert spelled_names(SRC, EXEMPT) == []


@pytest.mark.system
def test_what_is_left_out_or_exempt_is_in_the_schema_and_still_needed() -> None:
    assert LEFT_OUT.keys() <= set(schema.NAMES)
    assert {name for _, name in EXEMPT} <= SEARCHED | PATH_PARTS
    spelled = {(module, name) for module, _, name in literal_names(SRC)}
    assert [key for key in EXEMPT if key not in spelled] == []


@pytest.mark.fast
def test_a_planted_literal_is_found_and_prose_or_runfile_is_not(tmp_path: Path) -> None:
    (tmp_path / "acquisition").mkdir()
    (tmp_path / "runfile").mkdir()
    (tmp_path / "acquisition" / "leak.py").write_text(
        '"""Reads session_start_monotonic_ns."""\n'
        '# "time_host_raw" in a comment\n'
        'START = "session_start_monotonic_ns"\n'
        '"""time_raw: prose after a constant."""\n'
        'def tuning(x):\n'
        '    """Opens "/markers"."""\n'
        '    return f"analysis/tuning/{x}", "markers", "a time/value ratio"\n')
    (tmp_path / "runfile" / "owner.py").write_text('NAME = "time_raw"\n')
    assert spelled_names(tmp_path, {}) == [
        "acquisition/leak.py:3: session_start_monotonic_ns",
        "acquisition/leak.py:7: analysis", "acquisition/leak.py:7: tuning"]


# ---------------------------------------------------------------- (b) docs/run-file.md


def doc_rows(text: str, heading: str = "## Layout") -> list[list[str]]:
    """The cells of every table row in a section of the page (its subsections too)."""
    level = heading.split(maxsplit=1)[0]
    section = text.split(f"\n{heading}\n", 1)[1]
    section = re.split(rf"\n#{{1,{len(level)}}} ", section, maxsplit=1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines()
            if line.startswith("|") and not re.fullmatch(r"[|\-\s]+", line)]


def doc_names(rows: list[list[str]]) -> set[str]:
    """Names in backticks in every cell but the last (the last is prose), paths split up."""
    found = set()
    for row in rows:
        for cell in row[:-1]:
            for code in re.findall(r"`([^`]+)`", cell):
                found |= {p for p in re.split(r"[/:]", code) if p and not p.startswith("<")}
    return found


def doc_fields(text: str) -> set[tuple[str, str, np.dtype]]:
    """(table, field, type) of every row under "### Table fields"."""
    return {(row[0].strip("`"), row[1].strip("`"), np.dtype(row[2]))
            for row in doc_rows(text, "### Table fields")[1:]}


def schema_fields() -> set[tuple[str, str, np.dtype]]:
    return {(node.path, name, node.row.fields[name][0]) for node in schema.LAYOUT
            if node.row is not None for name in node.row.names or ()}


def doc_problems(text: str) -> list[str]:
    names, declared, documented = doc_names(doc_rows(text)), set(schema.NAMES), doc_fields(text)
    return ([f"docs/run-file.md does not name {n}" for n in sorted(declared - names)]
            + [f"docs/run-file.md names {n}, which the schema lacks"
               for n in sorted(names - declared)]
            + [f"table field {t}.{f} {d} is not in docs/run-file.md as in the schema"
               for t, f, d in sorted(schema_fields() - documented, key=str)]
            + [f"docs/run-file.md: table field {t}.{f} {d} is not the schema's"
               for t, f, d in sorted(documented - schema_fields(), key=str)])


@pytest.mark.fast
def test_the_doc_names_what_the_schema_declares() -> None:
    assert doc_problems(DOC.read_text(encoding="utf-8")) == []


@pytest.mark.fast
def test_a_doc_that_drifts_is_caught() -> None:
    text = DOC.read_text(encoding="utf-8")
    dropped = text.replace("| `/gaps` | `reason` | S128 | |\n", "")
    assert doc_problems(dropped) == [
        "docs/run-file.md does not name reason",
        f"table field /gaps.reason {np.dtype('S128')} is not in docs/run-file.md as in "
        "the schema"]
    extra = text.replace("| `/markers` | table | `time_unit`,", "| `/markers` | table | `unit_s`,")
    assert doc_problems(extra) == ["docs/run-file.md does not name time_unit",
                                   "docs/run-file.md names unit_s, which the schema lacks"]
    retyped = text.replace("| `/progress` | `ended` | uint8 |", "| `/progress` | `ended` | int64 |")
    assert len(doc_problems(retyped)) == 2 and "ended" in doc_problems(retyped)[0]


# ---------------------------------------------------------------- (c) a written file


def _child(pattern: str, name: str) -> str:
    """The schema path of ``name`` under ``pattern``: itself, else the placeholder there."""
    base = "" if pattern == "/" else pattern
    paths = [node.path for node in schema.LAYOUT]
    if f"{base}/{name}" in paths:
        return f"{base}/{name}"
    held = [p for p in paths if p.rpartition("/")[0] == base and p.rpartition("/")[2][:1] == "<"]
    return held[0] if len(held) == 1 else f"{base}/{name}"


def file_layout(f: h5py.File) -> set[str]:
    """Every group, dataset, attribute and table field of a file, on the schema's paths."""
    out: set[str] = set()

    def visit(obj: h5py.HLObject, path: str) -> None:
        out.update(f"{path} @{a}" for a in obj.attrs)
        if isinstance(obj, h5py.Dataset):
            out.add(f"{path} dataset")
            out.update(f"{path} .{n} {t.str}" for n, (t, *_) in (obj.dtype.fields or {}).items())
            return
        out.add(f"{path} group")
        for name, child in obj.items():
            visit(child, _child(path, name))

    visit(f, "/")
    return out


def schema_layout() -> set[str]:
    out = set()
    for node in schema.LAYOUT:
        out.add(f"{node.path} {'group' if node.group else 'dataset'}")
        out.update(f"{node.path} @{a}" for a in node.attrs)
        if node.row is not None:
            out.update(f"{node.path} .{n} {node.row.fields[n][0].str}" for n in node.row.names)
    return out


def layout_problems(path: Path, *, whole: bool) -> list[str]:
    """What the file holds beyond the schema (and, ``whole``, what it lacks of it)."""
    with h5py.File(path, "r", locking=False) as f:
        held = file_layout(f)
    while_writing = {f"/ @{a}" for a in schema.WRITING_ROOT_ATTRS}  # gone once closed
    return ([f"{path.name}: undeclared {x}" for x in sorted(held - schema_layout())]
            + [f"{path.name}: lacks {x}" for x in sorted(schema_layout() - held - while_writing)
               if whole])


LAYERS = LayersRecord(
    input=(1, 4), dtype="float32", train=False,
    roofline=RooflineLimits(peak_flops=1e12, bandwidth_bps=1e11, ridge_flop_per_byte=10.0,
                            source="table"),
    total_flops=0, total_macs=0, other_flops=0, rows=(), device="simulated H100", model="m")


def _tracker() -> ClockTracker:
    tracker = ClockTracker("agent", window_s=1.0)
    for k in range(20):
        t1 = 10**9 + k * 500_000_000
        tracker.add(ClockProbe(t1, t1 + 77_000 + 10_000, t1 + 77_000 + 20_000, t1 + 40_000))
    return tracker


def _calibration(source: str, kernel: str) -> CalibrationRecord:
    """A real stored record, retargeted: what is stored of it does not depend on the fit."""
    real = read_calibrations(str(DATA / "traces" / "h100_excite-seed1.h5"))[0]
    params = FittedParams(Estimate(0.1, 0.01), WIDTH_NAME[kernel], Estimate(0.5, 0.01),
                          Estimate(1.02, 0.01), Estimate(-3.0, 0.01))
    return replace(real, target=TargetStream(source, "power_w", "W"), kernel=kernel,
                   params=params, validity=CalibrationValidity(True, 0, [], []))


def _tuning(t0_ns: int) -> TuningRecord:
    n, ns = 2, t0_ns + np.array([10, 20], dtype=np.int64)
    ones = np.ones(n)
    return TuningRecord(
        {"iteration_source": "markers"}, [], [], ["sm_clock"],
        TuningProbes({"sm_clock": np.array([1980.0, 1500.0])}, ones, ones, ones, ones,
                     np.array([3, 4]), np.array(["baseline", "explore"], dtype=object)),
        TuningIterations(ns, ns + 5, ones, np.arange(n), np.ones(n, bool)),
        [{"t_ns": t0_ns + 15, "sm_clock": 1500.0}])


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file with every part: local and remote streams, a device clock, every record."""
    path = tmp_path_factory.mktemp("schema") / "run.h5"
    t0 = 10**9
    given = [*schema.SESSION_ROOT_ATTRS, *schema.OCCASIONAL_ROOT_ATTRS]
    writer = RunFileWriter(str(path), dict.fromkeys(given, "x"), t0)
    meter = SourceDescriptor("meter", "meter", "M", (Channel("power_w", "W"),),
                             time_raw="device_us_unwrapped")
    agent = SourceDescriptor("agent.gpu", "gpu", "G", (Channel("power_w", "W"),))
    writer.add_source(meter)
    writer.add_source(agent, remote_host="agent")
    t = t0 + np.arange(1000, dtype=np.int64) * 1_000_000
    rows = (np.ones((t.size, 1)), np.zeros(t.size, np.uint8))
    writer.append("meter", t + 50_000, (t - t0) // 1000, *rows)
    writer.append("agent.gpu", t, t, *rows, t_sender_ns=t + 77_000)
    writer.add_markers([Marker(t0 + 5, "step", t_gpu_ns=t0 + 9, gpu_uncertainty_ns=2)])
    writer.add_gaps([Gap("meter", "lost", 3, 4)])
    writer.add_progress([("meter", 1, t.size, True), ("agent.gpu", 1, t.size, True)])
    tracker = _tracker()
    writer.close(dict.fromkeys(schema.CLOSE_ROOT_ATTRS, "x"),
                 sync={"agent": (tracker.rows(), tracker.summary())},
                 remaps={"agent.gpu": tracker.to_local_ns})
    store_in_run(str(path), _calibration("meter", "boxcar"))
    store_in_run(str(path), _calibration("agent.gpu", "first_order"))
    write_layers(str(path), LAYERS)
    write_tuning(str(path), _tuning(t0))
    log = ['{"id": "r1", "start_unix_s": 1.2, "first_token_unix_s": 1.3, "end_unix_s": 1.9, '
           '"prompt_tokens": 10, "output_tokens": 5}']
    write_requests(str(path), "r.jsonl", parse_request_log("r.jsonl", log, 0, (1.0, 2.0)))
    return path


@pytest.mark.fast
def test_a_written_file_has_exactly_the_schemas_layout(written: Path) -> None:
    assert layout_problems(written, whole=True) == []


@pytest.mark.fast
def test_recorded_files_hold_nothing_the_schema_leaves_out() -> None:
    assert len(RECORDED) >= 10
    assert [p for path in RECORDED for p in layout_problems(path, whole=False)] == []


@pytest.mark.fast
def test_a_file_that_drifts_is_caught(written: Path, tmp_path: Path) -> None:
    drifted = tmp_path / "drifted.h5"
    shutil.copy(written, drifted)
    with h5py.File(drifted, "r+", locking=False) as f:
        f["sources/meter/values"].attrs["scale"] = 2.0
        del f["progress"]
    problems = layout_problems(drifted, whole=True)
    assert "drifted.h5: undeclared /sources/<id>/values @scale" in problems
    assert "drifted.h5: lacks /progress dataset" in problems


@pytest.mark.fast
def test_the_tuning_record_types_name_the_schemas_columns() -> None:
    assert [f.name for f in fields(TuningProbes)] == ["settings", *schema.PROBE_COLUMNS]
    assert [f.name for f in fields(TuningIterations)] == list(schema.ITERATION_COLUMNS)
