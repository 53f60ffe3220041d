"""Per-layer time and energy of ResNet50 and VGG16 training steps on a real GPU (read only).

Round three (in-step method): per case, `wattlab.layers.capture` records a profiled step
with a range around every leaf module (which kernels are whose), a plain profiled step
(the GPU's own idle time) and 15 s of plain steps with NVML's 50 Hz samples; then
`wattlab.layers.step_energy` gives each layer's GPU time from its kernels and its power by
folding the samples onto the step's phase. The rows' sums must come within 5 % of the
step timed with no profiler and of the energy counter's energy per step. Default clocks;
nothing is changed.

    PYTHONPATH=src python3 bench/layers_real.py            # capture and analyse (GPU, ~3 min)
    PYTHONPATH=src python3 bench/layers_real.py --from-captures DIR   # analyse saved captures

Captures go to results/layers_captures/ (``--captures DIR`` elsewhere); the table's rows
to results/layers_real.json.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, write_json

from wattlab.layers.capture import PLAIN_SECONDS

CASES = (("resnet50", 32), ("resnet50", 128), ("vgg16", 16), ("vgg16", 64))


def capture_case(name: str, batch: int, folder: Path, seconds: float) -> None:
    import torch

    from wattlab.layers import capture
    from wattlab.layers.model_spec import load_model

    model = load_model(name).cuda().train()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    times = capture.capture(model, x, folder, f"{name}{batch}", seconds=seconds)
    print(f"  {name} b{batch}: {times}", flush=True)
    del model
    torch.cuda.empty_cache()


def analyse_case(name: str, batch: int, folder: Path) -> dict[str, Any]:
    from wattlab.layers.capture import load
    from wattlab.layers.step_energy import analyse

    t0 = time.monotonic()
    out = analyse(load(folder, f"{name}{batch}"))
    return {"model": name, "batch": batch, "rows": {k: r.to_json() for k, r in out.rows.items()},
            "check": out.check.to_json(), "seconds": time.monotonic() - t0}


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"\n{'model':9} {'batch':>5} {'in-step ms':>14} {'idle ms':>8} {'step ms':>8} "
          f"{'time err':>8} {'layers J':>15} {'step J':>15} {'energy err':>10}")
    for r in results:
        if "error" in r:
            print(f"{r['model']:9} {r['batch']:5} failed: {r['error']}")
            continue
        c = r["check"]
        w = c["whole"]
        idle = "-" if c["idle_s"] is None else f"{c['idle_s'] * 1e3:.2f}"
        print(f"{r['model']:9} {r['batch']:5} {c['layers_time_s'] * 1e3:7.2f}±"
              f"{c['layers_time_se_s'] * 1e3:<6.2f} {idle:>8} {w['time_s'] * 1e3:8.2f} "
              f"{c['time_error']:+8.1%} {c['layers_energy_j']:7.3f}±"
              f"{c['layers_energy_se_j']:<7.3f} {w['energy_j']:7.3f}±{w['energy_se_j']:<7.3f} "
              f"{c['energy_error']:+10.2%}")
        print(f"  {c['note']}; {c['run_steps']} plain steps of {w['run_step_s'] * 1e3:.2f} ms, "
              f"{c['samples']} samples in {c['bins']} phase bins, delay "
              f"{c['delay_s'] * 1e3:g} ms")
        if c.get("warning"):
            print(f"  warning: {c['warning']}")
    print("in-step: the layers' GPU busy time (kernels of 10 profiled steps), 'between "
          "layers' and the plain step's GPU idle; step ms: plain, no profiler; layers J: "
          "folded 50 Hz samples × each row's share of the plain run's step; step J: the "
          "energy counter per plain step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-captures", metavar="DIR", help="analyse saved captures only")
    ap.add_argument("--captures", default=str(RESULTS / "layers_captures"), metavar="DIR",
                    help="where a live run writes its captures")
    ap.add_argument("--seconds", type=float, default=PLAIN_SECONDS, help="plain run per case (s)")
    args = ap.parse_args()
    folder = Path(args.from_captures or args.captures)
    if not args.from_captures:
        try:
            import torch

            if not torch.cuda.is_available():
                print("no CUDA GPU: nothing to capture (--from-captures DIR analyses saved "
                      "ones)")
                return
            print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
        except ImportError as e:
            print(f"needs torch with CUDA: {e}")
            return
    results: list[dict[str, Any]] = []
    for name, batch in CASES:
        try:
            if not args.from_captures:
                capture_case(name, batch, folder, args.seconds)
            results.append(analyse_case(name, batch, folder))
        except Exception as e:  # one case failing must not lose the others' numbers
            traceback.print_exc()
            results.append({"model": name, "batch": batch, "error": repr(e)})
    print_table(results)
    print("written:", write_json("layers_real", {"captures": str(folder), "results": results}))


if __name__ == "__main__":
    main()
