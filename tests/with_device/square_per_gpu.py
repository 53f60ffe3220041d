"""A square-wave load on one GPU, out of phase with the others (run one process per GPU).

Writes each edge as 'unix_ns level energy_counter_mJ' lines: the GPU's own energy counter,
read here at each edge, is the reference every reader's energy is compared with.
Read-only on the card: it only runs kernels.

    python square_per_gpu.py --gpu 1 --gpus 2 --period-s 2 --cycles 8 --edges edges1.txt
"""

from __future__ import annotations

import argparse
import time

import pynvml
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", type=int, required=True)
    parser.add_argument("--gpus", type=int, required=True, help="how many share the phase")
    parser.add_argument("--period-s", type=float, default=2.0)
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--start-unix-s", type=float, required=True,
                        help="a shared start instant, so the phases line up across processes")
    parser.add_argument("--edges", required=True)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    device = torch.device("cuda", args.gpu)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    torch.matmul(a, a)
    torch.cuda.synchronize(device)
    # GPU k is busy in [k/n, k/n + 1/2) of each period: every GPU its own phase
    offset_s = args.period_s * args.gpu / args.gpus
    t0 = args.start_unix_s + offset_s
    with open(args.edges, "w") as out:
        for k in range(2 * args.cycles + 1):
            edge = t0 + k * args.period_s / 2
            time.sleep(max(0.0, edge - time.time()))
            level = 1 if k % 2 == 0 and k < 2 * args.cycles else 0
            out.write(f"{time.time_ns()} {level} "
                      f"{pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)}\n")
            out.flush()
            end = edge + args.period_s / 2
            while level and time.time() < end:
                torch.matmul(a, a)
                torch.cuda.synchronize(device)
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
