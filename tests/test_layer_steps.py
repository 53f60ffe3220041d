"""Per-layer time inside real steps: the boundary hooks, the span attribution, the simulated
GPU against its true costs."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="wattlab layers needs PyTorch (extra 'layers')")
nn = torch.nn

from tests.layer_models import small_cnn  # noqa: E402
from wattlab.hardware.simulated_layer_gpu import SimulatedLayerGpu, simulated_h100_physics  # noqa: E402
from wattlab.integrations.layer_hooks import hook_leaves  # noqa: E402
from wattlab.layers import study  # noqa: E402
from wattlab.layers.counting import count_layers  # noqa: E402
from wattlab.layers.in_step import BETWEEN, split_steps, summarise  # noqa: E402
from wattlab.layers.plan_hooks import traced_step  # noqa: E402
from wattlab.layers.sim_backend import HOST_S, SimBackend  # noqa: E402

pytestmark = pytest.mark.fast


class Block(nn.Module):
    """A residual block as torchvision's: the residual added in place to a BN's output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn(self.conv(x))
        out += x
        return self.relu(out)


def residual_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), Block())


def test_span_attribution_by_hand() -> None:
    marks = [("", "step", 0.0), ("a:forward", "begin", 1.0), ("a:forward", "end", 3.0),
             ("b:forward", "begin", 4.0), ("c:backward", "begin", 5.0),
             ("c:backward", "end", 7.0), ("b:forward", "end", 8.0), ("", "step", 10.0),
             ("a:forward", "begin", 10.5), ("", "step", 12.0)]
    first, second = split_steps(marks)
    assert dict(first) == {BETWEEN: 1 + 1 + 2, "a:forward": 2, "b:forward": 1 + 1,
                           "c:backward": 2}
    assert dict(second) == {BETWEEN: 0.5, "a:forward": 1.5}  # open to the step's end
    s = summarise(marks)
    assert s.steps == 2 and s.step_s == pytest.approx(6.0)
    assert s.time_s["a:forward"] == pytest.approx(1.75)
    assert s.time_se_s["a:forward"] == pytest.approx(np.std([2, 1.5], ddof=1) / 2**0.5)


def test_hooks_see_every_boundary_and_change_nothing() -> None:
    model = residual_net()
    hooked = copy.deepcopy(model)
    seen: list[tuple[str, str, str]] = []
    x = torch.randn(2, 3, 8, 8)
    with hook_leaves(hooked, lambda label, p, edge, _call: seen.append((label, p, edge))):
        hooked(x).sum().backward()
    model(x).sum().backward()
    for a, b in zip(model.parameters(), hooked.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    labels = ["0", "1", "2.conv", "2.bn", "2.relu"]
    assert seen[:10] == [(n, "forward", e) for n in labels for e in ("begin", "end")]
    backward = seen[10:]
    assert backward == [(n, "backward", e) for n in labels[::-1] for e in ("begin", "end")]
    assert hooked[1].inplace and hooked[2].relu.inplace  # nothing changed on the model


def test_simulated_in_step_times_are_the_true_costs() -> None:
    """GPU-bound layers: in-step time = the simulator's cost; tiny layers: alone = host-bound."""
    physics = simulated_h100_physics()
    model = small_cnn()
    count = count_layers(model, (256, 3, 128, 128), train=True)
    backend = SimBackend(SimulatedLayerGpu(physics, 1))
    step = traced_step(model, count, {}, physics.default_pair, marks=True)
    s = summarise(backend.step_marks(step, 10))
    for row in count.rows:
        t, _ = physics.cost(row.work_flops, row.bytes_total, *physics.default_pair)
        assert s.time_s[row.key] == pytest.approx(float(t), rel=0.03), row.key
        alone = study.time_alone_s(backend, [("run", row.work_flops, row.bytes_total)])
        assert alone == pytest.approx(max(float(t), HOST_S), rel=0.03), row.key
    assert s.time_s[BETWEEN] > 0  # the loss runs outside every layer


def test_plan_clocks_from_nvml_or_a_stated_fallback() -> None:
    from wattlab.device_models.roofline import Roofline
    from wattlab.drivers.nvml import NvmlDriver
    from wattlab.hardware.fake_nvml import FakeNvml
    from wattlab.hardware.simulated_gpu import GpuModel, SimulatedGpu
    from wattlab.layers.clock_pairs import physics_for_gpu

    base = simulated_h100_physics()
    roofline = Roofline(50e12, 2e12, "measured")
    model = GpuModel(sm_clocks_mhz=(1410, 1200, 900), mem_clocks_mhz=(1593, 1215))
    driver = NvmlDriver(FakeNvml([SimulatedGpu(model=model, seed=2)]))
    physics, clocks = physics_for_gpu(base, roofline, 0, driver)
    assert clocks.source == "NVML, GPU 0" and clocks.pairs == 6
    sm, mem = physics.pairs()
    assert sorted(zip(sm.tolist(), mem.tolist(), strict=True)) == sorted(
        (float(s), float(m)) for s in (1410, 1200, 900) for m in (1593, 1215))
    assert physics.default_pair == (1410, 1593) and physics.roofline is roofline
    plan = study.plan_record(physics, count_layers(small_cnn(), (8, 3, 32, 32)), (0.1,))
    chosen = plan.scopes["forward"].plans[0].exhaustive
    assert set(chosen.sm_mhz) <= {1410, 1200, 900}
    missing = NvmlDriver(FakeNvml([SimulatedGpu(
        seed=2, unsupported=frozenset({"nvmlDeviceGetSupportedMemoryClocks"}))]))
    physics, clocks = physics_for_gpu(base, roofline, 0, missing)
    assert clocks.source == "simulated H100 list" and "supported clocks" in (clocks.reason or "")
    assert physics.pairs()[0].shape == base.pairs()[0].shape and physics.roofline is roofline


@pytest.mark.parametrize("switch_ms", [0.0, 0.5])
def test_heuristic_moves_only_the_slack_knob_within_each_layers_bound(switch_ms: float) -> None:
    from wattlab.layers.plan import evaluate, heuristic

    physics = simulated_h100_physics(switch_s=switch_ms / 1e3)
    count = count_layers(small_cnn(), (1, 3, 224, 224))
    surface = study.surface_of(physics, count.rows)
    work = np.array([r.work_flops for r in count.rows], float)
    moved = np.array([r.bytes_total for r in count.rows], float)
    d = surface.default
    for s in (0.0, 0.05, 0.2):
        plan = heuristic(surface, work, moved, physics.roofline, s)
        base = evaluate(surface, np.full(len(count.rows), d))
        for layer, c in enumerate(plan.choice):
            assert surface.time_s[layer, c] <= surface.time_s[layer, d] * (1 + s) * (1 + 1e-9)
            memory_bound = work[layer] / moved[layer] < physics.roofline.ridge
            fixed = surface.mem_mhz if memory_bound else surface.sm_mhz
            assert fixed[c] == fixed[d]
        worse = plan.energy_j > base.energy_j * 1.01 or plan.time_s > base.time_s * (1 + s)
        assert (plan.note is not None) == worse
        if switch_ms == 0.0:  # free switches: never worse than the default
            assert plan.energy_j <= base.energy_j * (1 + 1e-9) and not worse


def test_a_reused_module_is_a_plan_row_per_call() -> None:
    """One ReLU called twice: two rows, each may take its own pair, and executing the plan
    on the simulated GPU costs what the search predicted."""
    from wattlab.layers.plan_hooks import call_sequence

    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(512, 4096), relu, nn.Linear(4096, 4096), relu,
                          nn.Linear(4096, 8))
    count = count_layers(model, (256, 512), train=True)
    calls = call_sequence(model, count)
    fwd = [c for c in calls if c[0].endswith(":forward")]
    assert fwd == [("0:forward", 0), ("1:forward", 0), ("2:forward", 0), ("1:forward", 1),
                   ("4:forward", 0)]
    bwd = [c for c in calls if c[0].endswith(":backward")]
    assert bwd[:2] == [("4:backward", 0), ("1:backward", 1)]
    physics = simulated_h100_physics(switch_s=1e-5)
    rec = study.plan_record(physics, count, (0.2,), calls=calls).scopes["training step"]
    assert "1:forward#1" in rec.keys and len(rec.keys) == len(calls)
    plan = rec.plans[0].exhaustive
    ran = study.execute_plan(model, count, physics, plan, keys=rec.keys, min_window_s=0.5)
    assert ran.energy_j == pytest.approx(plan.energy_j, rel=0.03)


def test_a_step_the_hooks_slowed_is_flagged_as_host_bound():
    from wattlab.layers.measure import Measured
    from wattlab.layers.study import host_bound_warning

    whole = Measured(time_s=0.020, time_se_s=0.0002, energy_j=10.0, energy_se_j=0.1,
                     power_w=500.0, power_se_w=5.0, repeats=100, window_s=3.0)
    assert host_bound_warning(0.0203, whole) is None
    warning = host_bound_warning(0.064, whole)
    assert warning is not None and "+220%" in warning and "larger batch" in warning
