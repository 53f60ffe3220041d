"""A CUDA process for the device scripts: bf16 products of 8192² on GPU 0 for SECONDS.

    python3 bench/matmul_loop.py SECONDS [--pid-file F]

Twenty products, then a synchronise, until SECONDS have passed; ``--pid-file`` gets its pid
first (for a script to find its rows in a run). Read-only on the card: it only runs kernels.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("seconds", type=float)
    parser.add_argument("--pid-file")
    args = parser.parse_args()
    if args.pid_file:
        with open(args.pid_file, "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
