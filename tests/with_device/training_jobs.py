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
               eval_every: int, stall_every: int = 0, stall_s: float = 0.0) -> None:
    """A plain torch loop: ``optimizer.step`` is where the auto-markers hook in.

    ``stall_every``: before every such step (but the first) the loader also stalls
    ``stall_s`` (a queue refilled in batches).
    """
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
        if stall_every and step and step % stall_every == 0:
            time.sleep(stall_s)
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


# ------------------------------------------------------------------ nested periods (issue 38)
STEP_TARGET_S = 0.072  # the ResNet50 step: ~3.6 spacings of NVML's 50 Hz buffer


def resnet_at_step_time(target_s: float) -> tuple[nn.Module, torch.Tensor, torch.Tensor, int]:
    """ResNet50 (random weights, no download) with the batch that makes one training step
    take about ``target_s`` on this GPU: the traces then have the same shape on any card."""
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step_s(batch: int) -> float:
        x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device="cuda")
        for _ in range(3):
            nn.functional.cross_entropy(model(x), y).backward()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            nn.functional.cross_entropy(model(x), y).backward()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / 5

    batch = max(8, min(1024, round(64 * target_s / step_s(64))))
    opt.zero_grad(set_to_none=True)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    wattlab.mark("setup", model="resnet50", batch=batch, step_ms=round(step_s(batch) * 1e3, 1))
    return model, x, y, batch


def resnet_loop(args: argparse.Namespace, *, group: int, stall_s: float, accumulate: int,
                loader_s: Callable[[random.Random], float], eval_every: int) -> None:
    """A plain ResNet50 loop with the rhythms real training has inside a period.

    ``group`` steps back to back, then a loader stall of ``stall_s``; ``accumulate``
    micro-batches per optimizer step (each micro-batch is a ``truth_step``, each optimizer
    step a ``truth_group``); an evaluation pass every ``eval_every`` optimizer steps.
    """
    rng = random.Random(args.seed)
    model, x, y, _ = resnet_at_step_time(STEP_TARGET_S)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    torch.cuda.synchronize()
    time.sleep(1.0)
    optimizer_steps = 0
    for step in range(args.steps):
        if group and step and step % group == 0:
            time.sleep(stall_s)
        time.sleep(loader_s(rng))
        if step % accumulate == 0:
            torch.cuda.synchronize()
            wattlab.mark("truth_group", "begin")
        with truth_step(step):
            nn.functional.cross_entropy(model(x), y).backward()
        if step % accumulate == accumulate - 1:
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            wattlab.mark("truth_group", "end")
            optimizer_steps += 1
            if eval_every and optimizer_steps % eval_every == 0:
                with torch.no_grad(), wattlab.phase("eval"):
                    for _ in range(8):
                        model(x)
                    torch.cuda.synchronize()
    time.sleep(1.0)


@job("resnet-stall")
def resnet_stall(args: argparse.Namespace) -> None:
    """The issue's trace: groups of 7 steps of ~72 ms, then the loader stalls ~0.4 s."""
    resnet_loop(args, group=7, stall_s=0.4, accumulate=1, loader_s=lambda r: 0.0,
                eval_every=0)


@job("resnet-accum")
def resnet_accum(args: argparse.Namespace) -> None:
    """Gradient accumulation: 4 micro-batches (~72 ms each) per optimizer step, 5-15 ms of
    loading between micro-batches."""
    resnet_loop(args, group=0, stall_s=0.0, accumulate=4,
                loader_s=lambda r: r.uniform(0.005, 0.015), eval_every=0)


@job("resnet-eval")
def resnet_eval(args: argparse.Namespace) -> None:
    """An evaluation pass (8 forward batches) every 10 steps, 10-30 ms of loading a step."""
    resnet_loop(args, group=0, stall_s=0.0, accumulate=1,
                loader_s=lambda r: r.uniform(0.01, 0.03), eval_every=10)


@job("resnet-jitter")
def resnet_jitter(args: argparse.Namespace) -> None:
    """A jittery loader: log-normal waits, median 40 ms, one in ten over ~150 ms."""
    resnet_loop(args, group=0, stall_s=0.0, accumulate=1,
                loader_s=lambda r: min(1.0, r.lognormvariate(-3.2, 1.0)), eval_every=0)


@job("mlp-stall-3")
def mlp_stall(args: argparse.Namespace) -> None:
    """Groups of 3 MLP steps of ~170 ms, then a 1 s stall (a loader refilling its queue)."""
    plain_loop(args, width=8192, batch=16384, loader_s=(0.0, 0.01), eval_every=0,
               stall_every=3, stall_s=1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("job", choices=sorted(JOBS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    JOBS[args.job](args)


if __name__ == "__main__":
    main()
