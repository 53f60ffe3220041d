"""Short real training jobs for GPU-marker device tests: Lightning, plain PyTorch, HF Trainer.

    python gpu_jobs.py lightning|torch|hf [--steps N]
    python gpu_jobs.py torch --cpu-check      # tiny and on the CPU: the script itself works

Unmodified training code: no wattlab import; ``wattlab record --auto-markers`` adds the
markers. Each step is a stack of 8192 x 8192 TF32 matrix products (~0.1-0.3 s on an
H100/H200, the GPU clearly busy) on synthetic data: nothing is downloaded. The host never
synchronises inside the loop, so a host-time marker would be wrong by the queue's depth.
Before training the GPU idles 2 s (the idle level the test subtracts).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import torch

LAYERS = 4
REPEATS = 6  # 24 layer applications: 72 matrix products per step with the backward pass


class MatmulNet(torch.nn.Module):
    """Square layers applied ``REPEATS`` times to a fixed activation nudged by the input."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False)
                                          for _ in range(LAYERS))
        for layer in self.layers:
            torch.nn.init.orthogonal_(layer.weight)
        self.register_buffer("base", torch.randn(width, width) * 0.5)

    def forward(self, x: torch.Tensor, labels: Any = None) -> dict[str, torch.Tensor]:
        h = self.base + x.float().mean()
        for _ in range(REPEATS):
            for layer in self.layers:
                h = torch.tanh(layer(h))
        return {"loss": h.pow(2).mean()}


def inputs(steps: int) -> torch.Tensor:
    return torch.randn(steps * 4, 16)


class Job:
    """One job's size and device (``--cpu-check``: tiny, on the CPU, no idle wait)."""

    def __init__(self, steps: int, cpu: bool) -> None:
        self.steps, self.cpu = steps, cpu
        self.width = 64 if cpu else 8192
        self.device = "cpu" if cpu else "cuda"

    def idle_first(self) -> None:
        if not self.cpu:
            torch.cuda.synchronize()
            time.sleep(2.0)


def run_torch(job: Job) -> None:
    model = MatmulNet(job.width).to(job.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = inputs(job.steps).to(job.device)
    job.idle_first()
    for i in range(job.steps):
        opt.zero_grad(set_to_none=True)
        model(data[4 * i: 4 * i + 4])["loss"].backward()
        opt.step()
    if not job.cpu:
        torch.cuda.synchronize()


def run_lightning(job: Job) -> None:
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = MatmulNet(job.width)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0])["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

        def on_fit_start(self) -> None:
            job.idle_first()

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs(job.steps)),
                                         batch_size=4)
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(max_epochs=1, accelerator=job.device.replace("cuda", "gpu"), devices=1,
                             logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=root,
                             limit_val_batches=0)
        trainer.fit(Module(), loader)


class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i]}


def run_hf(job: Job) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class IdleFirst(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *args: Any, **kw: Any) -> None:
            job.idle_first()

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4,
                                 num_train_epochs=1, report_to=[], save_strategy="no",
                                 logging_strategy="no", disable_tqdm=True,
                                 dataloader_pin_memory=False, use_cpu=job.cpu)
        Trainer(model=MatmulNet(job.width), args=args, train_dataset=Rows(inputs(job.steps)),
                callbacks=[IdleFirst()]).train()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("job", choices=("lightning", "torch", "hf"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--cpu-check", action="store_true")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    job = Job(3 if args.cpu_check else args.steps, args.cpu_check)
    {"lightning": run_lightning, "torch": run_torch, "hf": run_hf}[args.job](job)
    if not job.cpu:
        time.sleep(1.0)  # the tail of the last step's power is recorded too


if __name__ == "__main__":
    main()
