"""The layer record typed (``runfile.LayersRecord``) keeps the study's JSON byte for byte.

tests/data/layers_record/ holds two records the study wrote while it still built a dict
(commit a8e0d09, the builders below with the dict-era code): a simulated GPU's (counts,
measured rows, executed plans) and a real GPU's (tests/data/layers' VGG16 capture, clock
pairs from a fake NVML). The study now builds each again, typed, from the same inputs: the
bytes it stores must be the fixture's, which are also what the dict-era writer stores for
the fixture's dict. And: the JSON reads back to an equal record, the report reads it, and a
bad record is refused with the key named.
"""

from __future__ import annotations

import copy
import gzip
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import h5py
import pytest

torch = pytest.importorskip("torch", reason="wattlab layers needs PyTorch (extra 'layers')")

from tests.data_files import LAYERS_RECORD  # noqa: E402
from tests.layer_models import Vgg16, small_cnn  # noqa: E402
from tests.test_equivalent_time import real_capture  # noqa: E402
from wattlab.cli import main  # noqa: E402
from wattlab.device_models import Roofline  # noqa: E402
from wattlab.drivers.nvml import NvmlDriver  # noqa: E402
from wattlab.errors import RunFileError  # noqa: E402
from wattlab.hardware.fake_nvml import FakeNvml  # noqa: E402
from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu  # noqa: E402
from wattlab.hardware.simulated_layer_gpu import simulated_h100_physics  # noqa: E402
from wattlab.layers import study  # noqa: E402
from wattlab.layers.clock_pairs import physics_for_gpu  # noqa: E402
from wattlab.layers.counting import count_layers  # noqa: E402
from wattlab.layers.plan_hooks import call_sequence  # noqa: E402
from wattlab.layers.real_study import with_step_energy  # noqa: E402
from wattlab.layers.step_energy import analyse  # noqa: E402
from wattlab.runfile import (  # noqa: E402
    FoldedMeasured,
    FoldedSumCheck,
    GroupMeasured,
    GroupSumCheck,
    LayersRecord,
    TimeEnergy,
    read_layers,
    schema,
    write_layers,
)
from wattlab.runfile.records import add_record  # noqa: E402

SIMULATED_ARGS = ("tests.layer_models:small_cnn", "--input", "64x3x32x32", "--train",
                  "--measure", "--plan", "--simulate", "--groups", "3", "--window", "0.2",
                  "--whole-window", "0.3", "--max-slowdown", "0", "--max-slowdown", "0.1")
"""`wattlab layers` as it made simulated.json.gz."""


def fixture(name: str) -> str:
    with gzip.open(LAYERS_RECORD / f"{name}.json.gz", "rt", encoding="utf-8") as f:
        return f.read()


def empty_run(path: Path) -> str:
    h5py.File(path, "w").close()
    return str(path)


def stored(path: str) -> str:
    with h5py.File(path, "r") as f:
        text = f[f"{schema.ANALYSIS}/{schema.LAYERS}"].attrs[schema.RECORD_JSON]
    assert isinstance(text, str)
    return text


def legacy_write(path: str, doc: dict[str, Any]) -> None:
    """``write_layers`` as it was while the record was a dict."""
    def fill(group: h5py.Group) -> None:
        group.attrs[schema.RECORD_JSON] = json.dumps(doc)

    add_record(path, (schema.LAYERS,), fill)


def real_record(tmp_path: Path) -> LayersRecord:
    """A real GPU's record as `wattlab layers --measure --plan` makes it, from saved captures.

    What needs the GPU is replaced: the captures are tests/data/layers', the roofline is
    given, NVML is the fake one.
    """
    model = Vgg16()
    count = count_layers(model, (64, 3, 224, 224), "float32", train=True)
    roofline = Roofline(60e12, 4.0e12, "measured")
    record = study.count_record(count, roofline, device="GPU 0", model="vgg16")
    record = with_step_energy(record, analyse(real_capture(tmp_path)))
    gpu = SimulatedGpu(model=GpuModel(sm_clocks_mhz=(1980, 1500, 1005),
                                      mem_clocks_mhz=(2619, 1593)), seed=2)
    physics, clocks = physics_for_gpu(simulated_h100_physics("float32", 0.5e-3), roofline, 0,
                                      NvmlDriver(FakeNvml([gpu])))
    return replace(record, plans=study.predicted_plans(
        physics, clocks, count, (0.0, 0.1), calls=call_sequence(model, count)))


@pytest.mark.system
def test_the_simulated_study_stores_the_dict_era_bytes(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    want = fixture("simulated")
    run = empty_run(tmp_path / "new.h5")
    assert main(["layers", *SIMULATED_ARGS, "--store", run, "-o", str(tmp_path / "l.json")]) == 0
    assert stored(run) == want
    old = empty_run(tmp_path / "old.h5")
    legacy_write(old, json.loads(want))
    assert stored(old) == want
    # -o wrote json.dump(record, indent=2) in the dict era
    assert (tmp_path / "l.json").read_text() == json.dumps(json.loads(want), indent=2)
    assert "executed on the simulated GPU: exhaustive 10%" in capsys.readouterr().out


@pytest.mark.system
def test_the_real_gpu_study_stores_the_dict_era_bytes(tmp_path: Path) -> None:
    want = fixture("real")
    run = empty_run(tmp_path / "new.h5")
    write_layers(run, real_record(tmp_path))
    assert stored(run) == want
    old = empty_run(tmp_path / "old.h5")
    legacy_write(old, json.loads(want))
    assert stored(old) == want


@pytest.mark.fast
@pytest.mark.parametrize("name", ["simulated", "real"])
def test_a_record_reads_back_equal_and_writes_the_same_bytes(name: str, tmp_path: Path) -> None:
    text = fixture(name)
    record = LayersRecord.from_json(text)
    assert record.to_json() == text
    assert LayersRecord.from_json(record.to_json()) == record
    run = empty_run(tmp_path / "run.h5")
    write_layers(run, record)
    assert read_layers(run) == record and stored(run) == text


@pytest.mark.fast
def test_each_form_reads_as_its_class() -> None:
    simulated = LayersRecord.from_json(fixture("simulated"))
    assert all(isinstance(r.measured, GroupMeasured) for r in simulated.rows)
    assert isinstance((simulated.checks or {})["training step"], GroupSumCheck)
    assert simulated.plans is not None and simulated.plans.clocks is not None
    assert simulated.plans.note is None and simulated.plans.clocks.reason is None
    executed = simulated.plans.scopes["training step"].executed or {}
    assert list(executed) == ["default", "exhaustive 0%", "exhaustive 10%"]
    real = LayersRecord.from_json(fixture("real"))
    assert all(isinstance(r.measured, FoldedMeasured) for r in real.rows)
    check = (real.checks or {})["training step"]
    assert isinstance(check, FoldedSumCheck) and check.idle_s is None
    assert check.between == check.outside_rows["between layers"]
    assert real.plans is not None and real.plans.clocks is not None
    assert real.plans.clocks.sm_mhz_range == (1005, 1980)
    assert real.rows[0].key == "features.0:forward" and real.rows[0].in_shapes == ((64, 3, 224,
                                                                                   224),)


@pytest.mark.fast
def test_a_record_of_counts_only_leaves_the_other_keys_out() -> None:
    count = count_layers(small_cnn(), (2, 3, 16, 16))
    record = study.count_record(count, simulated_h100_physics().roofline,
                                device="simulated H100", model="small")
    doc = json.loads(record.to_json())
    assert list(doc) == ["input", "dtype", "train", "roofline", "total_flops", "total_macs",
                         "other_flops", "rows", "device", "model"]
    assert all("measured" not in r for r in doc["rows"])
    assert LayersRecord.from_json(record.to_json()) == record


@pytest.mark.fast
def test_a_real_check_without_a_between_row_keeps_its_zeros() -> None:
    doc = json.loads(fixture("real"))
    check = doc["checks"]["training step"]
    check["outside_rows"] = {}
    check["between"] = {"time_s": 0.0, "time_se_s": 0.0, "energy_j": 0.0, "energy_se_j": 0.0}
    text = json.dumps(doc)
    record = LayersRecord.from_json(text)
    assert isinstance((record.checks or {})["training step"].between, TimeEnergy)
    assert record.to_json() == text


def spoil(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with the value at ``path`` replaced (``...``: the key removed)."""
    out = copy.deepcopy(doc)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if value is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


@pytest.mark.fast
@pytest.mark.parametrize(("path", "value", "said"), [
    (("model",), ..., "lacks model"),
    (("rows", 0, "calls"), "1", "rows[0].calls: expected int, got str"),
    (("rows", 0, "calls"), True, "rows[0].calls: expected int, got bool"),
    (("rows", 0, "in_shapes", 0, 1), 3.0, "rows[0].in_shapes[0][1]: expected int, got float"),
    (("rows",), {}, "rows: expected a list, got dict"),
    (("roofline", "ridge_flop_per_byte"), None,
     "roofline.ridge_flop_per_byte: expected float, got NoneType"),
    (("rows", 2, "measured", "group"), ..., "lacks rows[2].measured.group"),
    (("checks", "training step", "whole"), ..., "lacks checks.training step.whole"),
    (("plans", "scopes", "forward", "plans", 1, "exhaustive", "sm_mhz"), "x",
     "plans.scopes.forward.plans[1].exhaustive.sm_mhz: expected a list, got str"),
    (("plans", "clocks"), [], "plans.clocks is not a JSON object"),
])
def test_a_bad_record_names_its_key(path: tuple[Any, ...], value: Any, said: str) -> None:
    bad = json.dumps(spoil(json.loads(fixture("simulated")), path, value))
    with pytest.raises(RunFileError) as e:
        LayersRecord.from_json(bad)
    assert said in str(e.value)


@pytest.mark.fast
def test_a_bad_document_or_a_bad_stored_record_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunFileError, match="not JSON"):
        LayersRecord.from_json("{")
    with pytest.raises(RunFileError, match="the record is not a JSON object"):
        LayersRecord.from_json("[]")
    run = empty_run(tmp_path / "run.h5")
    legacy_write(run, spoil(json.loads(fixture("real")), ("device",), ...))
    with pytest.raises(RunFileError, match=r"run\.h5: layers record: lacks device"):
        read_layers(run)


@pytest.mark.system
def test_the_report_draws_a_real_gpu_record(tmp_path: Path) -> None:
    from wattlab.analysis.report.layers_view import layers_panel

    run = empty_run(tmp_path / "run.h5")
    write_layers(run, LayersRecord.from_json(fixture("real")))
    panel = layers_panel(run)
    assert panel is not None
    summary = panel[2]
    assert "vgg16" in summary and "78 layer rows on GPU 0" in summary
    assert "training step: layers sum 33.98" in summary and "max slowdown 10%" in summary
