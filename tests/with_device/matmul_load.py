"""A known GPU load for device tests: idle / half-duty / full bf16 matrix products.

Marks each phase with ``wattlab.phase`` so the run file shows where the load changed.
Read-only on the card: it only runs kernels.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import wattlab


def busy(seconds: float, duty: float, a: torch.Tensor, b: torch.Tensor) -> None:
    """Run matrix products for ``duty`` of every 100 ms slice, sleep for the rest."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        slice_end = time.monotonic() + 0.1 * duty
        while time.monotonic() < slice_end:
            torch.matmul(a, b)
            torch.cuda.synchronize()
        time.sleep(0.1 * (1 - duty))


def energy_counter_mj() -> Callable[[], int]:
    """GPU 0's energy counter, read here at each step: the reference every reader is
    compared with, read by none of them."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each phase")
    parser.add_argument("--steps", help="write each phase's start (unix ns, name, the energy "
                                        "counter in mJ) to this file")
    args = parser.parse_args()
    steps = open(args.steps, "w") if args.steps else None  # noqa: SIM115 - closed below
    counter = energy_counter_mj()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.matmul(a, b)
    torch.cuda.synchronize()
    for name, duty in (("idle", 0.0), ("full", 1.0), ("idle", 0.0), ("half", 0.5),
                       ("full", 1.0), ("idle", 0.0)):
        if steps is not None:
            steps.write(f"{time.time_ns()} {name} {counter()}\n")
            steps.flush()
        with wattlab.phase(name, duty=duty):
            if duty == 0:
                time.sleep(args.seconds)
            else:
                busy(args.seconds, duty, a, b)
    if steps is not None:
        steps.write(f"{time.time_ns()} end {counter()}\n")
        steps.close()


if __name__ == "__main__":
    main()
