"""Per-layer time and energy of ResNet50 and VGG16 training steps on a real GPU (read only).

Each layer's time inside 20 real training steps (CUDA events recorded from hooks at every
layer boundary, forward and backward), its power from its group of consecutive layers
replayed alone while NVML's energy counter runs, energy = power × in-step time; the time
outside every layer is the row "between layers". The whole step (no hooks) is measured
directly for 3 s: the sums must come within 5 % of it. The layers' times alone are
printed too (launch-bound layers look longer alone). Default clocks; nothing is changed.

PYTHONPATH=src python3 bench/layers_real.py   (about 3 minutes on an H100; needs torch,
torchvision and pynvml; writes results/layers_real.json)
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_json

CASES = (("resnet50", 32), ("resnet50", 128), ("vgg16", 16), ("vgg16", 64))
GROUPS, WINDOW_S, WHOLE_WINDOW_S = 16, 0.8, 3.0


def one(name: str, batch: int) -> dict[str, object]:
    import torch

    from wattlab.layers import study
    from wattlab.layers.counting import count_layers
    from wattlab.layers.model_spec import load_model
    from wattlab.layers.real_study import measure_real
    from wattlab.layers.roofline import measure_roofline

    t0 = time.monotonic()
    model = load_model(name)
    count = count_layers(model, (batch, 3, 224, 224), "float32", train=True)
    record = study.count_record(count, measure_roofline("float32"))
    checks = measure_real(record, model, count, gpu=0, n_groups=GROUPS, window_s=WINDOW_S,
                          whole_window_s=WHOLE_WINDOW_S,
                          progress=lambda s: print(f"  {name}: {s}", flush=True))
    del model
    torch.cuda.empty_cache()
    c = checks["training step"]
    rows = [{k: r[k] for k in ("name", "kind", "pass_name", "flops", "bytes_total", "intensity",
                                "bound")} | {"measured": r.get("measured")}
            for r in record["rows"]]
    return {"model": name, "batch": batch, "roofline": record["roofline"],
            "total_macs": count.total_macs, "check": c, "rows": rows,
            "seconds": time.monotonic() - t0}


def main() -> None:
    try:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA GPU: nothing to measure (bench/layers_sim.py runs without one)")
            return
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    except ImportError as e:
        print(f"needs torch with CUDA: {e}")
        return
    results = []
    for name, batch in CASES:
        try:
            results.append(one(name, batch))
        except Exception as e:  # one model failing must not lose the other's numbers
            traceback.print_exc()
            results.append({"model": name, "batch": batch, "error": repr(e)})
        try:
            torch.cuda.empty_cache()
        except Exception as e:  # a broken CUDA context: the next model reports it
            print(f"empty_cache: {e!r}")
    print(f"\n{'model':9} {'batch':>5} {'in-step ms':>14} {'alone ms':>9} {'between ms':>10} "
          f"{'step ms':>14} {'time err':>8} {'layers J':>14} {'step J':>14} {'energy err':>10} "
          f"{'s':>4}")
    for r in results:
        if "error" in r:
            print(f"{r['model']:9} {r['batch']:5} failed: {r['error']}")
            continue
        c = r["check"]
        w, b = c["whole"], c["between"]
        print(f"{r['model']:9} {r['batch']:5} {c['layers_time_s'] * 1e3:7.2f}±"
              f"{c['layers_time_se_s'] * 1e3:<6.2f} {c['layers_alone_time_s'] * 1e3:9.2f} "
              f"{b['time_s'] * 1e3:10.2f} {w['time_s'] * 1e3:7.2f}±{w['time_se_s'] * 1e3:<6.2f} "
              f"{c['time_error']:+8.1%} "
              f"{c['layers_energy_j']:7.3f}±{c['layers_energy_se_j']:<6.3f} "
              f"{w['energy_j']:7.3f}±{w['energy_se_j']:<6.3f} {c['energy_error']:+10.1%} "
              f"{r['seconds']:4.0f}")
        if c.get("warning"):
            print(f"  {r['model']} batch {r['batch']}: {c['warning']}")
    print("in-step: the rows and 'between layers' summed (events at every layer boundary, "
          "20 steps); alone: the layers' sum replayed one by one; step: no hooks, 3 s")
    print("written:", write_json("layers_real", {"results": results}))


if __name__ == "__main__":
    main()
