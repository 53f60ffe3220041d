"""Runs a random-telegraph load on a real GPU (PyTorch or CuPy), marking each hold.

    python -m wattlab.acquisition.experiments.telegraph_on_gpu --gpu 0 --seed 1 --duration 60

Run by `wattlab excite` as the recorded command; read-only on the card (it only runs
matrix products). A half level is matrix products for half of every 10 ms slice.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from wattlab.acquisition.experiments.telegraph_schedule import MAX_HOLD_S, MIN_HOLD_S, telegraph
from wattlab.errors import UsageError

SLICE_S = 0.01


def matmul_backend(gpu: int) -> Callable[[], None]:
    """One bf16 8192² product on the GPU and a wait for it: PyTorch first, else CuPy."""
    try:
        import torch

        if torch.cuda.is_available():
            device = torch.device("cuda", gpu)
            a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

            def torch_product() -> None:
                torch.matmul(a, a)
                torch.cuda.synchronize(device)

            return torch_product
    except ImportError:
        pass
    try:
        import cupy

        with cupy.cuda.Device(gpu):
            b = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32).astype(cupy.float16)

        def cupy_product() -> None:
            with cupy.cuda.Device(gpu):
                cupy.matmul(b, b)
                cupy.cuda.Device(gpu).synchronize()

        return cupy_product
    except ImportError:
        pass
    raise UsageError("wattlab excite needs PyTorch or CuPy with a CUDA GPU "
                     "(pip install 'wattlab[excite]'), or --simulate")


def busy_until(end: float, duty: float, product: Callable[[], None]) -> None:
    """Products for ``duty`` of every slice until ``end`` (monotonic s), idle for the rest."""
    while time.monotonic() < end:
        slice_end = min(end, time.monotonic() + SLICE_S)
        work_end = time.monotonic() + duty * SLICE_S
        while duty > 0 and time.monotonic() < work_end:
            product()
        time.sleep(max(0.0, slice_end - time.monotonic()))


def main() -> None:
    import wattlab

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--min-hold", type=float, default=MIN_HOLD_S)
    parser.add_argument("--max-hold", type=float, default=MAX_HOLD_S)
    args = parser.parse_args()
    schedule = telegraph(args.seed, args.duration, min_hold_s=args.min_hold,
                         max_hold_s=args.max_hold)
    product = matmul_backend(args.gpu)
    product()  # warm-up outside the marked holds
    end = time.monotonic()
    for segment in schedule.segments:
        end += segment.duration_s
        with wattlab.phase("excite", level=segment.utilisation):
            busy_until(end, segment.utilisation, product)


if __name__ == "__main__":
    main()
