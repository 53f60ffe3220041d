"""Per-layer time and energy of ResNet50 and VGG16 training steps on a real GPU (read only).

Every layer (forward and backward) alone on its real inputs, energy in groups of
consecutive layers from NVML's energy counter, and the whole step measured directly: the
layers' sums must come within 5 % of it. Default clocks; nothing is changed on the GPU.

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

CASES = (("resnet50", 32), ("vgg16", 16))
GROUPS, WINDOW_S = 20, 0.8


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
    import torch

    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    results = []
    for name, batch in CASES:
        try:
            results.append(one(name, batch))
        except Exception as e:  # one model failing must not lose the other's numbers
            traceback.print_exc()
            results.append({"model": name, "batch": batch, "error": repr(e)})
    print(f"\n{'model':9} {'batch':>5} {'layers ms':>10} {'step ms':>9} {'time err':>8} "
          f"{'layers J':>16} {'step J':>16} {'energy err':>10} {'s':>5}")
    for r in results:
        if "error" in r:
            print(f"{r['model']:9} {r['batch']:5} failed: {r['error']}")
            continue
        c = r["check"]
        w = c["whole"]
        print(f"{r['model']:9} {r['batch']:5} {c['layers_time_s'] * 1e3:10.2f} "
              f"{w['time_s'] * 1e3:9.2f} {c['time_error']:+8.1%} "
              f"{c['layers_energy_j']:9.3f}±{c['layers_energy_se_j']:<6.3f} "
              f"{w['energy_j']:9.3f}±{w['energy_se_j']:<6.3f} {c['energy_error']:+10.1%} "
              f"{r['seconds']:5.0f}")
    print("written:", write_json("layers_real", {"results": results}))


if __name__ == "__main__":
    main()
