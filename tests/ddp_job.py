"""A rank of a tiny torch.distributed (gloo, CPU) job: join, wait a few seconds, leave together.

Run by torchrun in tests/test_ranks.py and bench/job_torchrun.py; each rank writes its rank
and whether it ran under a wattlab session, so a test can see every rank ran once.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    seconds, out_dir = float(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    total = torch.zeros(1)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
    total += rank
    dist.all_reduce(total)
    dist.barrier()
    (out_dir / f"rank{rank}").write_text(f"{os.environ.get('WATTLAB_BUS', '')}\n{total.item()}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
