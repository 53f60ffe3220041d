"""Per-layer clock plans on the simulated H100: exhaustive vs heuristic, and the thesis's
findings (forward-only savings at about default speed; training gains only with a slowdown).

Plan rows are per layer call (a reused module may switch at each call).

PYTHONPATH=src python bench/layers_sim.py [resnet50|vgg16|small_cnn]   (ResNet50 and VGG16
need torchvision; a few minutes each; writes results/layers_sim_<model>.json)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_json
from tests.layer_models import small_cnn

from wattlab.hardware.simulated_layer_gpu import simulated_h100_physics
from wattlab.layers import study
from wattlab.layers.counting import count_layers
from wattlab.layers.plan_hooks import call_sequence

TRAIN_BATCH = {"resnet50": 32, "vgg16": 16, "small_cnn": 64}
SWITCH_MS = (0.0, 0.5)


def cases(name: str) -> tuple[tuple[str, tuple[int, ...], bool, str], ...]:
    b = TRAIN_BATCH[name]
    return (("forward, batch 1", (1, 3, 224, 224), False, "forward"),
            (f"training step, batch {b}", (b, 3, 224, 224), True, "training step"))


def model(name: str) -> object:
    if name == "small_cnn":
        return small_cnn()
    from wattlab.layers.model_spec import load_model
    return load_model(name)


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    net = model(name)
    rows, results = [], {}
    print(f"model {name} on the simulated H100")
    print(f"{'case':26} {'switch ms':>9} {'slowdown':>8} {'exhaustive':>10} {'at time':>8} "
          f"{'gap J':>8} {'heuristic':>10} {'at time':>8}")
    for label, shape, train, scope in cases(name):
        count = count_layers(net, shape, train=train)
        calls = call_sequence(net, count)
        for sw in SWITCH_MS:
            physics = simulated_h100_physics(switch_s=sw / 1e3)
            rec = study.plan_record(physics, count, calls=calls).scopes[scope]
            for e in rec.plans:
                ex, he = e.exhaustive, e.heuristic
                print(f"{label:26} {sw:9.1f} {e.max_slowdown:8.0%} {ex.energy_saving:10.1%} "
                      f"{ex.slowdown:+8.1%} {ex.gap_j:8.2g} {he.energy_saving:10.1%} "
                      f"{he.slowdown:+8.1%}")
                rows.append({"case": label, "switch_ms": sw, "max_slowdown": e.max_slowdown,
                             "exhaustive_saving": ex.energy_saving,
                             "exhaustive_slowdown": ex.slowdown, "gap_j": ex.gap_j,
                             "exhaustive_energy_j": ex.energy_j,
                             "heuristic_saving": he.energy_saving,
                             "heuristic_slowdown": he.slowdown})
    def saving(case: str, slow: float, sw: float = 0.5) -> float:
        return next(r["exhaustive_saving"] for r in rows if r["case"] == case
                    and r["max_slowdown"] == slow and r["switch_ms"] == sw)
    results["findings"] = {}
    train_case = cases(name)[1][0]
    for sw in SWITCH_MS:
        fwd_default = saving("forward, batch 1", 0.02, sw)
        train_default = saving(train_case, 0.02, sw)
        train_slow = saving(train_case, 0.2, sw)
        findings = {
            "forward-only: moderate savings at about default speed (>= 3 % at <= 2 % slowdown)":
                {"saving": fwd_default, "holds": fwd_default >= 0.03},
            "training: no significant saving without slowdown (< 3 % at <= 2 %)":
                {"saving": train_default, "holds": train_default < 0.03},
            "training: larger savings with a slowdown (20 % bound saves > 2x the 2 % bound)":
                {"saving": train_slow, "holds": train_slow > 2 * max(train_default, 1e-3)},
        }
        results["findings"][f"switch {sw} ms"] = findings
        for claim, v in findings.items():
            print(f"switch {sw} ms: {'holds' if v['holds'] else 'does not hold'}: {claim} "
                  f"({v['saving']:.1%})")
    print("written:", write_json(f"layers_sim_{name}", {"model": name, "rows": rows,
                                                         **results}))


if __name__ == "__main__":
    main()
