"""Framework integrations: real small models where the framework is installed, else skip."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from wattlab.errors import UsageError
from wattlab.integrations import PhaseEmitter
from wattlab.runtime_env import AUTO_ENV, SITE_DIR, auto_marker_env

third_party_noise = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning",
    "ignore::ResourceWarning", "ignore::PendingDeprecationWarning")


class Recorder:
    """A ``mark`` stand-in that keeps (name, kind, payload) in order."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, name: str, kind: str = "point", **payload: Any) -> None:
        self.marks.append((name, kind, payload))

    def kinds(self, name: str) -> list[str]:
        return [k for n, k, _ in self.marks if n == name]

    def balanced(self) -> bool:
        stack: list[str] = []
        for name, kind, _ in self.marks:
            if kind == "begin":
                stack.append(name)
            elif kind == "end" and (not stack or stack.pop() != name):
                return False
        return not stack


def need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed here (optional framework)")


# ----------------------------------------------------------------------------- emitter


@pytest.mark.fast
def test_emitter_balances_and_thins_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    em = PhaseEmitter(every_n_steps=2, mark=rec, framework="x")
    em.begin("epoch", epoch=0)
    for step in range(4):
        em.step_begin(step)
        em.step_end()
    em.end("missing")  # never begun: ignored
    em.step_begin(4)
    em.close_all()  # training crashed inside a step
    assert rec.kinds("step") == ["begin", "end", "begin", "end", "begin", "end"]
    assert rec.marks[0] == ("epoch", "begin", {"epoch": 0, "framework": "x"})
    assert rec.balanced() and em.open_phases == []
    monkeypatch.setenv("WATTLAB_MARK_EVERY", "0")
    assert PhaseEmitter().every_n_steps == 0
    monkeypatch.setenv("WATTLAB_MARK_EVERY", "often")
    with pytest.raises(UsageError, match="WATTLAB_MARK_EVERY"):
        PhaseEmitter()


@pytest.mark.fast
def test_end_closes_inner_phases_left_open() -> None:
    rec = Recorder()
    em = PhaseEmitter(mark=rec)
    em.begin("epoch")
    em.begin("step")
    em.end("epoch")
    assert [(n, k) for n, k, _ in rec.marks] == [
        ("epoch", "begin"), ("step", "begin"), ("step", "end"), ("epoch", "end")]


# ----------------------------------------------------------------------------- plain torch


@pytest.mark.fast
def test_loop_wrappers_mark_each_body() -> None:
    from wattlab.integrations.torch_helper import epochs, steps, validation

    rec = Recorder()
    em = PhaseEmitter(mark=rec)
    for _ in epochs(2, emitter=em):
        for batch in steps([1, 2, 3], emitter=em):
            if batch == 3:
                break  # leaving the loop early still ends the step
        with validation(emitter=em):
            pass
    assert rec.kinds("epoch") == ["begin", "end"] * 2
    assert rec.kinds("step") == ["begin", "end"] * 6
    assert rec.kinds("validation") == ["begin", "end"] * 2
    assert rec.balanced()


@pytest.mark.system
def test_optimizer_step_hook_with_real_torch() -> None:
    need("torch")
    import torch

    from wattlab.integrations.torch_helper import mark_optimizer_steps

    rec = Recorder()
    marks = mark_optimizer_steps(every_n_steps=2, emitter=PhaseEmitter(2, rec))
    try:
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            opt.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            opt.step()
    finally:
        marks.remove()
    opt.step()  # after remove(): no marker
    assert [p["step"] for n, _, p in rec.marks if n == "optimizer_step"] == [0, 2, 4]
    # the steps that end at a marked optimizer step, from the one before it
    assert [(k, p.get("step")) for n, k, p in rec.marks if n == "step"] == [
        ("begin", 2), ("end", None), ("begin", 4), ("end", None)]


# ----------------------------------------------------------------------------- frameworks


@pytest.mark.system
@third_party_noise
def test_lightning_callback_marks_fit(tmp_path: Path) -> None:
    need("lightning")
    import lightning.pytorch as pl
    import torch

    from wattlab.integrations.lightning import WattlabCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.layer(batch[0])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(12, 3))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    rec = Recorder()
    trainer = pl.Trainer(max_epochs=2, callbacks=[WattlabCallback(mark=rec)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path),
                         accelerator="cpu", num_sanity_val_steps=1)
    trainer.fit(Tiny(), loader, loader)
    assert rec.kinds("fit") == ["begin", "end"]
    assert rec.kinds("epoch") == ["begin", "end"] * 2
    assert rec.kinds("step") == ["begin", "end"] * 6
    assert rec.kinds("validation") == ["begin", "end"] * 2
    assert rec.kinds("sanity_check") == ["begin", "end"]
    assert rec.balanced()
    assert [p["epoch"] for n, k, p in rec.marks if n == "epoch" and k == "begin"] == [0, 1]


@pytest.mark.system
@third_party_noise
def test_keras_callback_marks_fit_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    need("keras")
    if "keras" not in sys.modules:
        monkeypatch.setenv("KERAS_BACKEND", os.environ.get("KERAS_BACKEND", "torch"))
    try:
        import keras
    except ImportError as e:
        pytest.skip(f"Keras has no usable backend here: {e}")
    import numpy as np

    from wattlab.integrations.keras import WattlabCallback

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    rec = Recorder()
    x, y = np.ones((16, 3), "float32"), np.ones((16, 1), "float32")
    model.fit(x, y, epochs=2, batch_size=4, validation_split=0.25, verbose=0,
              callbacks=[WattlabCallback(mark=rec)])
    model.predict(x, verbose=0, callbacks=[WattlabCallback(mark=rec)])
    assert rec.kinds("fit") == ["begin", "end"]
    assert rec.kinds("epoch") == ["begin", "end"] * 2
    assert rec.kinds("step") == ["begin", "end"] * 6
    assert rec.kinds("validation") == ["begin", "end"] * 2
    assert rec.kinds("predict") == ["begin", "end"]
    assert rec.balanced()


@pytest.mark.system
@third_party_noise
def test_huggingface_callback_marks_training(tmp_path: Path) -> None:
    need("transformers")
    need("accelerate")
    import torch
    from transformers import Trainer, TrainingArguments

    from wattlab.integrations.huggingface import WattlabCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
            out = self.layer(x).squeeze(-1)
            return {"loss": ((out - labels) ** 2).mean(), "logits": out}

    class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"x": torch.full((4,), i / 8), "labels": torch.tensor(i / 8)}

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4,
                             num_train_epochs=2, report_to=[], save_strategy="no",
                             logging_strategy="no", eval_strategy="epoch", use_cpu=True,
                             disable_tqdm=True)
    rec = Recorder()
    Trainer(model=Tiny(), args=args, train_dataset=Data(), eval_dataset=Data(),
            callbacks=[WattlabCallback(mark=rec)]).train()
    assert rec.kinds("fit") == ["begin", "end"]
    assert rec.kinds("epoch") == ["begin", "end"] * 2
    assert rec.kinds("step") == ["begin", "end"] * 4
    assert rec.kinds("evaluate") == ["point"] * 2
    assert rec.balanced()


# ----------------------------------------------------------------------------- auto-markers


@pytest.mark.fast
def test_auto_marker_env_prepends_the_site_folder() -> None:
    env = auto_marker_env({"PYTHONPATH": "/a"})
    assert env == {"PYTHONPATH": SITE_DIR + os.pathsep + "/a", AUTO_ENV: "1"}
    assert auto_marker_env({})["PYTHONPATH"] == SITE_DIR
    assert (Path(SITE_DIR) / "sitecustomize.py").is_file()


CHILD = textwrap.dedent("""
    import json, sys
    print(json.dumps({
        "hooked": any(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path),
        "user_site": "user_sitecustomize_ran" in sys.modules}))
""")


@pytest.mark.system
def test_sitecustomize_installs_hooks_in_an_unmodified_program(tmp_path: Path) -> None:
    """A child Python with the env additions only; also a user's sitecustomize still runs."""
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(
        "import sys, types\nsys.modules['user_sitecustomize_ran'] = types.ModuleType('x')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("WATTLAB_BUS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(user_site)
    env.update(auto_marker_env(env))
    env["PYTHONWARNINGS"] = "ignore"
    result = subprocess.run([sys.executable, "-c", CHILD], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"hooked": True, "user_site": True}
    assert "auto-markers" not in result.stderr


@pytest.mark.system
@third_party_noise
def test_patches_add_callbacks_once(tmp_path: Path) -> None:
    """The patches the import hook applies, on subclasses so nothing global changes."""
    need("lightning")
    import types

    import lightning.pytorch as pl

    from wattlab.integrations.auto_markers import patch_lightning

    trainer_cls = type("Trainer", (pl.Trainer,), {})
    patch_lightning(types.SimpleNamespace(__name__="lightning.pytorch", Trainer=trainer_cls))
    kw = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
          "default_root_dir": str(tmp_path)}
    names = [type(c).__name__ for c in trainer_cls(**kw).callbacks]
    assert names.count("WattlabLightningCallback") == 1
    from wattlab.integrations.lightning import WattlabCallback

    mine = WattlabCallback(every_n_steps=5)
    callbacks = trainer_cls(callbacks=[mine], **kw).callbacks
    assert [c for c in callbacks if type(c).__name__ == "WattlabLightningCallback"] == [mine]


@pytest.mark.system
def test_record_with_auto_markers_marks_plain_torch(tmp_path: Path) -> None:
    """End to end: a real session records the optimizer steps of an unmodified script."""
    need("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    """))
    out = tmp_path / "run.h5"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "wattlab.cli", "record", "--simulate",
                             "--auto-markers", "-o", str(out), "--", sys.executable, str(script)],
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    import wattlab

    with wattlab.open(str(out)) as run:
        steps = [m.payload["step"] for m in run.markers if m.name == "optimizer_step"]
    assert steps == list(range(6))
