"""Runs the qualification's three levels on a real GPU (PyTorch or CuPy), marking each.

    python -m wattlab.acquisition.experiments.qualify_levels_on_gpu --gpu 0 --level-s 63 \
        [--levels idle,load1]

Run by `wattlab qualify --gpu I` as the recorded command: phases ``idle``, ``load1`` (matrix
products half of every 10 ms slice) and ``load2`` (all of it), each ``--level-s`` long.
``--no-load`` only marks the levels: a simulated GPU follows its own workload (rehearsals
and tests on the fake NVML, where no CUDA device runs products). ``--levels`` runs only
those, in the qualification's order (a qualification recorded in parts).
"""

from __future__ import annotations

import argparse
import time

from wattlab.acquisition.experiments.telegraph_on_gpu import busy_until, matmul_backend

LEVEL_DUTIES = (("idle", 0.0), ("load1", 0.5), ("load2", 1.0))
"""The qualification's levels (docs/qualify.md) and the share of each slice kept busy."""


def main() -> None:
    import wattlab

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--level-s", type=float, required=True)
    parser.add_argument("--levels", default=",".join(name for name, _ in LEVEL_DUTIES))
    parser.add_argument("--no-load", action="store_true",
                        help="mark the levels without running products (a simulated GPU)")
    args = parser.parse_args()
    product = (lambda: None) if args.no_load else matmul_backend(args.gpu)
    product()  # warm-up outside the marked levels
    end = time.monotonic()
    wanted = set(args.levels.split(","))
    for name, duty in LEVEL_DUTIES:
        if name not in wanted:
            continue
        end += args.level_s
        with wattlab.phase(name):
            busy_until(end, duty if not args.no_load else 0.0, product)


if __name__ == "__main__":
    main()
