"""`wattlab layers MODEL`: per-layer FLOPs, bytes, roofline class, energy and clock plans."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from wattlab.arg_types import (
    GPU_INDEX,
    SEED,
    SLOWDOWN,
    Folder,
    InputFile,
    Number,
    OutputFile,
    count,
    seconds,
)
from wattlab.layers.capture import PLAIN_SECONDS
from wattlab.layers.equivalent_time import DELAY_S
from wattlab.runfile import (
    BetweenLayers,
    ClockPlans,
    FoldedMeasured,
    FoldedSumCheck,
    GroupMeasured,
    GroupSumCheck,
    LayersRecord,
    TimeEnergy,
    write_layers,
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "layers", help="per-layer work, energy and clock plans of a PyTorch model",
        description="Count FLOPs, MACs and bytes of every leaf module (forward and, with "
                    "--train, backward), classify each against the GPU's roofline, measure "
                    "each layer's time and energy alone (--measure) and search a clock pair "
                    "per layer (--plan). See docs/layers.md.")
    p.add_argument("model", help="a torchvision model name (resnet50) or module:callable")
    p.add_argument("--input", default="1x3x224x224", metavar="SHAPE",
                   help="input shape, sizes joined by x (default 1x3x224x224)")
    p.add_argument("--batch", type=count(), metavar="N",
                   help="batch size (replaces the first size)")
    p.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16")
    p.add_argument("--train", action="store_true", help="a training step: backward rows too")
    p.add_argument("--simulate", action="store_true",
                   help="the simulated H100 (default where no CUDA GPU is present)")
    p.add_argument("--gpu", type=GPU_INDEX, default=0, metavar="I", help="GPU index (default 0)")
    p.add_argument("--measure", action="store_true",
                   help="measure every layer's time and energy (in groups) and the whole pass")
    p.add_argument("--groups", type=count(1, 10_000), default=24, metavar="N",
                   help="simulated GPU: measure energy in at most N groups of consecutive "
                        "layers per pass (default 24)")
    p.add_argument("--window", type=seconds(3600), default=1.0, metavar="S",
                   help="simulated GPU: seconds each group runs for its power (default 1.0)")
    p.add_argument("--whole-window", type=seconds(3600), default=3.0, metavar="S",
                   help="simulated GPU: seconds the whole pass runs for its energy "
                        "(default 3.0)")
    p.add_argument("--seconds", type=Number(2, 3600, unit="s"), default=PLAIN_SECONDS, metavar="S",
                   help="real GPU: seconds of plain steps whose power samples are folded "
                        f"onto the step (default {PLAIN_SECONDS:g})")
    p.add_argument("--sample-delay-ms", type=Number(0, 1000, unit="ms"), default=1e3 * DELAY_S,
                   metavar="MS",
                   help="real GPU: how far NVML's 50 Hz samples lag the power they stand "
                        f"for (default {1e3 * DELAY_S:g})")
    p.add_argument("--keep-captures", metavar="DIR", type=Folder("captures folder"),
                   help="real GPU: keep the profiler traces and samples in DIR")
    p.add_argument("--plan", action="store_true",
                   help="search a clock pair per layer (exhaustive and heuristic); on the "
                        "simulated GPU also run the plans and measure them")
    p.add_argument("--max-slowdown", type=SLOWDOWN, action="append", metavar="F",
                   help="slowdown bound(s) for --plan (repeatable; default 0, .02, .05, .1, .2)")
    p.add_argument("--switch-ms", type=Number(0, 1000, unit="ms"), default=0.5, metavar="MS",
                   help="time one clock change stalls the GPU (default 0.5 ms)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the simulated GPU")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("-o", "--output", type=OutputFile("record file"),
                   help="write the record (JSON) here")
    p.add_argument("--store", metavar="RUN", type=InputFile("run file"),
                   help="add the record to a run file (/analysis/layers)")
    return p


def _print_table(r: LayersRecord) -> None:
    print(f"{r.model}: input {'x'.join(map(str, r.input))} {r.dtype}, "
          f"{r.total_macs / 1e9:.4g} GMACs, {r.total_flops / 1e9:.4g} GFLOPs; roofline "
          f"{r.roofline.peak_flops / 1e12:.4g} TFLOP/s, "
          f"{r.roofline.bandwidth_bps / 1e12:.4g} TB/s ({r.roofline.source})")
    print(f"{'layer':34} {'kind':16} {'pass':8} {'MFLOPs':>10} {'MB':>9} {'FLOP/B':>8} "
          f"{'bound':7} {'in-step ms':>16} {'alone ms':>9} {'energy mJ':>14}")
    for row in r.rows:
        m = row.measured
        alone = (f"{m.time_alone_s * 1e3:9.4f}" if isinstance(m, GroupMeasured)
                 else f"{'-':>9}")
        te = (f"{m.time_s * 1e3:8.4f}±{m.time_se_s * 1e3:<7.2g} "
              f"{alone} {m.energy_j * 1e3:8.3f}±"
              f"{m.energy_se_j * 1e3:<5.2g}" if m else "")
        ai = "-" if row.intensity is None else f"{row.intensity:.3g}"
        print(f"{(row.name or '(model)')[:34]:34} {row.kind[:16]:16} {row.pass_name:8} "
              f"{row.flops / 1e6:10.2f} {row.bytes_total / 1e6:9.3f} {ai:>8} "
              f"{row.bound:7} {te}")
    for scope, check in (r.checks or {}).items():
        _print_check(scope, check)
    if r.plans is not None:
        _print_plans(r.plans)


def _print_check(scope: str, check: GroupSumCheck | FoldedSumCheck) -> None:
    w = check.whole
    for name, b in _extra_rows(check):
        print(f"{name:34} {'':16} {'':8} {'':>10} {'':>9} {'':>8} {'':7} "
              f"{b.time_s * 1e3:8.4f}±{b.time_se_s * 1e3:<7.2g} {'':>9} "
              f"{b.energy_j * 1e3:8.3f}±{b.energy_se_j * 1e3:<5.2g}")
    print(f"{scope}: layers sum {check.layers_time_s * 1e3:.3f} ms, "
          f"{check.layers_energy_j:.4g} ± {check.layers_energy_se_j:.2g} J; whole "
          f"{w.time_s * 1e3:.3f} ms, {w.energy_j:.4g} ± {w.energy_se_j:.2g} J "
          f"(time {check.time_error:+.1%}, energy {check.energy_error:+.1%})")
    if check.warning:
        print(f"  warning: {check.warning}")
    if isinstance(check, FoldedSumCheck) and check.note:
        print(f"  {check.note}")


def _print_plans(plans: ClockPlans) -> None:
    source = plans.clocks.source if plans.clocks else "simulated H100 list"
    for scope, block in plans.scopes.items():
        print(f"plans, {scope} (switch {plans.switch_s * 1e3:g} ms, "
              f"{plans.pairs} clock pairs from the {source}):")
        for e in block.plans:
            ex, he = e.exhaustive, e.heuristic
            print(f"  max slowdown {e.max_slowdown:5.0%}: exhaustive saves "
                  f"{ex.energy_saving:6.1%} at {ex.slowdown:+.1%} time "
                  f"({ex.switches} switches, gap {ex.gap_j:.2g} J); heuristic "
                  f"{he.energy_saving:6.1%} at {he.slowdown:+.1%} "
                  f"({he.switches} switches)")
            if he.note:
                print(f"    heuristic: {he.note}")
        for name, m in (block.executed or {}).items():
            print(f"  executed on the simulated GPU: {name}: {m.energy_j:.4g} ± "
                  f"{m.energy_se_j:.2g} J, {m.time_s * 1e3:.3f} ms per pass")


def _extra_rows(check: GroupSumCheck | FoldedSumCheck
                ) -> list[tuple[str, TimeEnergy | FoldedMeasured | BetweenLayers]]:
    """The rows outside every layer: ``between layers`` and, on a real GPU, the GPU's idle."""
    if isinstance(check, FoldedSumCheck):
        return list(check.outside_rows.items())
    return [("between layers", check.between)]


def run(args: argparse.Namespace) -> int:
    from wattlab.layers.counting import count_layers
    from wattlab.layers.model_spec import load_model, parse_shape, torch_dtype, with_batch

    shape = with_batch(parse_shape(args.input), args.batch)
    torch_dtype(args.dtype)
    model = load_model(args.model)
    count = count_layers(model, shape, args.dtype, args.train)
    record = _study(args, model, count)
    if args.output:
        with open(args.output, "x", encoding="utf-8") as f:
            f.write(record.to_json(indent=2))
    if args.store:
        write_layers(args.store, record)
    if args.json:
        print(record.to_json(indent=2))
    else:
        _print_table(record)
    return 0


def _simulated(args: argparse.Namespace) -> bool:
    if args.simulate:
        return True
    import torch

    if not torch.cuda.is_available():
        print("wattlab layers: no CUDA GPU: the simulated H100", file=sys.stderr)
        return True
    return False


def _study(args: argparse.Namespace, model: Any, count: Any) -> LayersRecord:
    from wattlab.device_models import measure_roofline
    from wattlab.hardware.simulated_layer_gpu import simulated_h100_physics
    from wattlab.layers import study

    simulated = _simulated(args)
    physics = simulated_h100_physics(args.dtype, args.switch_ms / 1e3)
    roofline = physics.roofline if simulated else measure_roofline(args.dtype)
    record = study.count_record(count, roofline, model=args.model,
                                device="simulated H100" if simulated else f"GPU {args.gpu}")
    if args.measure:
        if simulated:
            record = study.measure_simulated(
                record, model, count, physics, seed=args.seed, n_groups=args.groups,
                window_s=args.window, whole_window_s=args.whole_window)
        else:
            from wattlab.layers.real_study import measure_real

            record = measure_real(
                record, model, count, gpu=args.gpu, seconds=args.seconds,
                delay_s=args.sample_delay_ms / 1e3, keep=args.keep_captures,
                progress=lambda s: print(f"wattlab layers: {s}", file=sys.stderr))
    if args.plan:
        record = replace(record, plans=_plans(args, model, count, physics=physics,
                                              roofline=roofline, simulated=simulated))
    return record


def _plans(args: argparse.Namespace, model: Any, count: Any, *, physics: Any, roofline: Any,
           simulated: bool) -> ClockPlans:
    from wattlab.layers import study
    from wattlab.layers.plan_hooks import call_sequence

    slowdowns = args.max_slowdown or study.SLOWDOWNS
    calls = call_sequence(model, count)
    if simulated:
        return study.simulated_plans(model, count, physics, slowdowns, calls=calls,
                                     seed=args.seed, min_window_s=args.window)
    # the simulated GPU's power model on this GPU's clocks and roofline: a prediction
    from wattlab.layers.clock_pairs import physics_for_gpu

    physics, clocks = physics_for_gpu(physics, roofline, args.gpu)
    return study.predicted_plans(physics, clocks, count, slowdowns, calls=calls)
