"""Real training jobs for the iteration, marker and calibration traces (run on a real GPU).

Each job trains a small synthetic model (no downloads) with steps that jitter the way real
training does: a data loader that takes 0.05-0.4 s per batch, an evaluation pass every few
steps. Beside whatever markers the framework integration takes (host time), every step is
also marked ``truth_step`` with the GPU synchronised at both edges, so that window is the
step's GPU execution: the truth the analyses are checked against. Read-only on the card.

    wattlab record --nvml 0 --auto-markers -o run.h5 -- python training_jobs.py torch-long
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

import wattlab

JOBS: dict[str, Callable[[argparse.Namespace], None]] = {}


def job(name: str) -> Callable[[Callable[[argparse.Namespace], None]],
                               Callable[[argparse.Namespace], None]]:
    def register(fn: Callable[[argparse.Namespace], None]) -> Callable[[argparse.Namespace], None]:
        JOBS[name] = fn
        return fn
    return register


def mlp(width: int, depth: int = 2, inputs: int = 4096) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10)).cuda()


@contextmanager
def truth_step(step: int) -> Iterator[None]:
    """A step's window on the GPU's time: synchronised at both edges."""
    torch.cuda.synchronize()
    with wattlab.phase("truth_step", step=step):
        yield
        torch.cuda.synchronize()


def loader_wait(rng: random.Random, lo_s: float, hi_s: float) -> None:
    """A data loader that takes a random time per batch (the host is the bottleneck)."""
    time.sleep(rng.uniform(lo_s, hi_s))


def plain_loop(args: argparse.Namespace, width: int, batch: int, loader_s: tuple[float, float],
               eval_every: int) -> None:
    """A plain torch loop: ``optimizer.step`` is where the auto-markers hook in."""
    rng = random.Random(args.seed)
    model = mlp(width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, 4096, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(3):  # warm-up outside the marked steps
        loss_fn(model(x), y).backward()
    torch.cuda.synchronize()
    time.sleep(1.0)
    for step in range(args.steps):
        loader_wait(rng, *loader_s)
        with truth_step(step):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
        if eval_every and step % eval_every == eval_every - 1:
            with torch.no_grad(), wattlab.phase("eval"):
                for _ in range(3):
                    model(x)
                torch.cuda.synchronize()
    time.sleep(1.0)


@job("torch-long")
def torch_long(args: argparse.Namespace) -> None:
    """Steps of ~0.2 s at ~full power, 0.05-0.4 s apart: the issue's Lightning-like shape."""
    plain_loop(args, width=8192, batch=16384, loader_s=(0.05, 0.4), eval_every=15)


@job("torch-medium")
def torch_medium(args: argparse.Namespace) -> None:
    """Steps of ~60-80 ms (3-4 sample spacings), spacing jittered by ±50 %."""
    plain_loop(args, width=4096, batch=8192, loader_s=(0.03, 0.09), eval_every=0)


@job("torch-short")
def torch_short(args: argparse.Namespace) -> None:
    """Steps of a few ms, far shorter than the 20 ms sample spacing: unresolvable."""
    plain_loop(args, width=1024, batch=1024, loader_s=(0.001, 0.004), eval_every=0)


class RandomBatches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Synthetic batches whose loading takes a random 0.05-0.4 s (on the host)."""

    def __init__(self, n: int, batch: int, seed: int) -> None:
        self.n, self.batch, self.rng = n, batch, random.Random(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        loader_wait(self.rng, 0.05, 0.4)
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.batch, 4096, generator=g), torch.randint(0, 10, (self.batch,))


@job("lightning")
def lightning_job(args: argparse.Namespace) -> None:
    """The issue's job: Lightning, 4096-8192-8192-10 MLP, batch 16384, loader-bound."""
    import lightning as L

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(8192)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x[0]), y[0])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    class Truth(L.Callback):
        def on_train_batch_start(self, *a: object, **k: object) -> None:
            torch.cuda.synchronize()
            wattlab.mark("truth_step", "begin")

        def on_train_batch_end(self, *a: object, **k: object) -> None:
            torch.cuda.synchronize()
            wattlab.mark("truth_step", "end")

    data = torch.utils.data.DataLoader(RandomBatches(args.steps, 16384, args.seed), batch_size=1)
    trainer = L.Trainer(max_epochs=1, accelerator="gpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        callbacks=[Truth()])
    trainer.fit(Net(), data)
    time.sleep(1.0)


@job("hf-trainer")
def hf_job(args: argparse.Namespace) -> None:
    """The Hugging Face Trainer on the same kind of MLP (it returns its loss in a dict)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(8192)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": nn.functional.cross_entropy(self.net(x), labels)}

    class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.inner = RandomBatches(args.steps, 8192, args.seed)

        def __len__(self) -> int:
            return args.steps

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            x, y = self.inner[i]
            return {"x": x, "labels": y}

    def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return rows[0]

    class Truth(TrainerCallback):
        def on_step_begin(self, *a: object, **k: object) -> None:
            torch.cuda.synchronize()
            wattlab.mark("truth_step", "begin")

        def on_step_end(self, *a: object, **k: object) -> None:
            torch.cuda.synchronize()
            wattlab.mark("truth_step", "end")

    with tempfile.TemporaryDirectory() as out:  # the Trainer wants a folder; saves nothing
        targs = TrainingArguments(output_dir=out, per_device_train_batch_size=1,
                                  num_train_epochs=1, report_to=[], save_strategy="no",
                                  logging_strategy="no", dataloader_num_workers=0,
                                  remove_unused_columns=False, disable_tqdm=True)
        Trainer(model=Net().cuda(), args=targs, train_dataset=Rows(), data_collator=collate,
                callbacks=[Truth()]).train()
    time.sleep(1.0)


@job("square-1hz")
def square(args: argparse.Namespace) -> None:
    """A 1 Hz square wave (0.5 s full, 0.5 s idle): a 1 s boxcar averages it flat."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.matmul(a, a)
    torch.cuda.synchronize()
    time.sleep(1.0)
    t0 = time.monotonic()
    for k in range(args.steps):
        with wattlab.phase("on", cycle=k):
            while time.monotonic() < t0 + k + 0.5:
                torch.matmul(a, a)
                torch.cuda.synchronize()
        with wattlab.phase("off", cycle=k):
            time.sleep(max(0.0, t0 + k + 1.0 - time.monotonic()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("job", choices=sorted(JOBS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    JOBS[args.job](args)


if __name__ == "__main__":
    main()
