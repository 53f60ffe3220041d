"""Per-layer clock plans on the simulated H100: exhaustive vs heuristic, and the thesis's
findings (forward-only savings at about default speed; training gains only with a slowdown).

python bench/layers_sim.py  (about a minute; writes results/layers_sim.json)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_json
from tests.layer_models import small_cnn

from wattlab.hardware.simulated_layer_gpu import LayerPhysics
from wattlab.layers import study
from wattlab.layers.counting import count_layers

CASES = (("forward, batch 1", (1, 3, 224, 224), False, "forward"),
         ("forward, batch 64", (64, 3, 224, 224), False, "forward"),
         ("training step, batch 64", (64, 3, 224, 224), True, "training step"))
SWITCH_MS = (0.0, 0.5)


def model() -> object:
    try:
        from wattlab.layers.model_spec import load_model
        return "resnet50", load_model("resnet50")
    except Exception:  # no torchvision here: the small CNN of the tests
        return "small_cnn", small_cnn()


def main() -> None:
    name, net = model()
    rows, results = [], {}
    print(f"model {name} on the simulated H100")
    print(f"{'case':26} {'switch ms':>9} {'slowdown':>8} {'exhaustive':>10} {'at time':>8} "
          f"{'gap J':>8} {'heuristic':>10} {'at time':>8}")
    for label, shape, train, scope in CASES:
        count = count_layers(net, shape, train=train)
        for sw in SWITCH_MS:
            physics = LayerPhysics.simulated_h100(switch_s=sw / 1e3)
            rec = study.plan_record(physics, count)["scopes"][scope]
            for e in rec["plans"]:
                ex, he = e["exhaustive"], e["heuristic"]
                print(f"{label:26} {sw:9.1f} {e['max_slowdown']:8.0%} {ex['energy_saving']:10.1%} "
                      f"{ex['slowdown']:+8.1%} {ex['gap_j']:8.2g} {he['energy_saving']:10.1%} "
                      f"{he['slowdown']:+8.1%}")
                rows.append({"case": label, "switch_ms": sw, "max_slowdown": e["max_slowdown"],
                             "exhaustive_saving": ex["energy_saving"],
                             "exhaustive_slowdown": ex["slowdown"], "gap_j": ex["gap_j"],
                             "exhaustive_energy_j": ex["energy_j"],
                             "heuristic_saving": he["energy_saving"],
                             "heuristic_slowdown": he["slowdown"]})
    def saving(case: str, slow: float, sw: float = 0.5) -> float:
        return next(r["exhaustive_saving"] for r in rows if r["case"] == case
                    and r["max_slowdown"] == slow and r["switch_ms"] == sw)
    results["findings"] = {}
    for sw in SWITCH_MS:
        fwd_default = max(saving("forward, batch 1", 0.02, sw),
                          saving("forward, batch 64", 0.02, sw))
        train_default = saving("training step, batch 64", 0.02, sw)
        train_slow = saving("training step, batch 64", 0.2, sw)
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
    print("written:", write_json("layers_sim", {"model": name, "rows": rows, **results}))


if __name__ == "__main__":
    main()
