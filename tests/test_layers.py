"""`wattlab layers`: counts against hand-computed MACs, plans against brute force, the
simulated GPU's measurements against its true costs, the record in a run and its report."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="wattlab layers needs PyTorch (extra 'layers')")

from tests.layer_models import small_cnn, tiny_mlp  # noqa: E402
from wattlab.device_models.layer_physics import LayerPhysics  # noqa: E402
from wattlab.hardware.simulated_layer_gpu import SimulatedLayerGpu, simulated_h100_physics  # noqa: E402
from wattlab.layers import study  # noqa: E402
from wattlab.layers.counting import count_layers  # noqa: E402
from wattlab.layers.measure import measure  # noqa: E402
from wattlab.layers.plan import best_within, evaluate, min_weighted  # noqa: E402
from wattlab.layers.sim_backend import SimBackend  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def wattlab(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "wattlab.cli", "layers", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.fast
def test_small_cnn_macs_by_hand() -> None:
    count = count_layers(small_cnn(), (2, 3, 16, 16), train=True)
    conv1 = 2 * 8 * 16 * 16 * (3 * 3 * 3)  # out elements x (in channels x kernel)
    conv2 = 2 * 16 * 8 * 8 * (8 * 3 * 3)
    linear = 2 * 16 * 10
    fwd = {r.name: r for r in count.of_pass("forward")}
    bwd = {r.name: r for r in count.of_pass("backward")}
    assert [r.name for r in count.of_pass("forward")] == [str(i) for i in range(9)]
    assert (fwd["0"].macs, fwd["4"].macs, fwd["8"].macs) == (conv1, conv2, linear)
    # backward: grad input and grad weight; the first conv's input needs no gradient
    assert bwd["4"].macs == 2 * conv2 and bwd["0"].macs == conv1 and bwd["8"].macs == 2 * linear
    assert count.total_macs == 2 * (conv1 + conv2 + linear) + conv2 + linear
    assert count.other_flops == 0
    # bytes: the first conv reads weights + input, writes its output (float32)
    assert fwd["0"].weight_bytes == (8 * 3 * 9 + 8) * 4
    assert fwd["0"].activation_bytes == (2 * 3 * 16 * 16 + 2 * 8 * 16 * 16) * 4
    assert fwd["2"].work_flops == 2 * 8 * 16 * 16 and fwd["2"].flops == 0


@pytest.mark.system
def test_cli_counts_json_and_bad_input() -> None:
    out = wattlab("tests.layer_models:small_cnn", "--input", "1x3x16x16", "--json")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["total_macs"] == sum(r["macs"] for r in record["rows"])
    assert {r["bound"] for r in record["rows"]} <= {"compute", "memory"}
    for bad, said in ((["--input", "1x3xa"], "--input"), (["--dtype", "int8"], "--dtype"),
                      (["--batch", "0"], "--batch")):
        out = wattlab("tests.layer_models:small_cnn", *bad)
        assert out.returncode == 2 and said in out.stderr
    out = wattlab("tests.layer_models:nope")
    assert out.returncode == 2 and "nope" in out.stderr


@pytest.mark.fast
def test_torchvision_totals_within_3_percent() -> None:
    pytest.importorskip("torchvision", reason="torchvision is not importable beside this "
                        "torch build (see BENCHMARKS.md for the count in its own venv)")
    from wattlab.layers.model_spec import load_model

    for name, published in (("resnet50", 4.09e9), ("vgg16", 15.47e9)):
        macs = count_layers(load_model(name), (1, 3, 224, 224)).total_macs
        assert abs(macs / published - 1) < 0.03


def small_physics() -> LayerPhysics:
    full = simulated_h100_physics()
    return LayerPhysics(full.roofline, (1980, 1500, 1005, 510), (2619, 1593), switch_s=2e-5)


@pytest.mark.fast
def test_exhaustive_plan_is_the_brute_force_optimum() -> None:
    count = count_layers(tiny_mlp(), (512, 64))
    surface = study.surface_of(small_physics(), count.rows)
    plans = [evaluate(surface, c) for c in
             itertools.product(range(surface.time_s.shape[1]), repeat=len(count.rows))]
    for lam in (0.0, 100.0, 1e4):
        assert min_weighted(surface, lam)[1] == pytest.approx(
            min(p.energy_j + lam * p.time_s for p in plans), rel=1e-12)
    base = evaluate(surface, [surface.default] * len(count.rows))
    for slowdown in (0.0, 0.1, 0.5, 2.0):
        plan = best_within(surface, slowdown)
        feasible = [p.energy_j for p in plans if p.time_s <= base.time_s * (1 + slowdown)]
        assert plan.time_s <= base.time_s * (1 + slowdown) * (1 + 1e-9)
        assert min(feasible) <= plan.energy_j <= min(feasible) + plan.gap_j + 1e-15
        assert plan.energy_j == pytest.approx(min(feasible), rel=1e-3)


@pytest.mark.fast
def test_simulated_measurement_matches_true_cost() -> None:
    physics = simulated_h100_physics()
    job = [("run", 4e9, 30e6), ("run", 1e6, 60e6)]
    m = measure(SimBackend(SimulatedLayerGpu(physics, 3)), job, 1.0)
    t, p = physics.cost([4e9, 1e6], [30e6, 60e6], *physics.default_pair)
    assert abs(m.time_s - t.sum()) < 4 * m.time_se_s + 1e-3 * t.sum()
    assert abs(m.energy_j - (t * p).sum()) < 4 * m.energy_se_j
    assert m.window_s >= 1.0 * 0.98


@pytest.mark.system
def test_cli_measure_plan_store_report(tmp_path: Path) -> None:
    from tests.test_report import write_synthetic_run
    from wattlab.analysis.report.html_report import build_report

    run_path = tmp_path / "run.h5"
    write_synthetic_run(run_path)
    out = wattlab("tests.layer_models:small_cnn", "--input", "256x3x128x128", "--train",
                  "--measure", "--plan", "--groups", "3", "--window", "0.5", "--simulate",
                  "--max-slowdown", "0", "--max-slowdown", "0.2", "--store", str(run_path),
                  "-o", str(tmp_path / "l.json"))
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "l.json").read_text())
    check = record["checks"]["training step"]
    assert abs(check["energy_error"]) < 0.05 and abs(check["time_error"]) < 0.05
    assert all("measured" in r for r in record["rows"])
    block = record["plans"]["scopes"]["training step"]
    for e in block["plans"]:
        assert e["exhaustive"]["energy_saving"] >= e["heuristic"]["energy_saving"] - 1e-9
        assert e["exhaustive"]["slowdown"] <= e["max_slowdown"] + 1e-9
    executed = block["executed"]["exhaustive 20%"]
    predicted = block["plans"][-1]["exhaustive"]["energy_j"]
    assert executed["energy_j"] == pytest.approx(predicted, rel=0.05)
    result = build_report(str(run_path), str(tmp_path / "r.html"))
    html = (tmp_path / "r.html").read_text()
    assert "Layers" in html and any(p.endswith("_layers.png") for p in result.png_paths)
