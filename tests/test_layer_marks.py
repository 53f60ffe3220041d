"""Per-layer markers: a phase per leaf module and pass on sampled steps, on the GPU's time
(fake CUDA events), in-process and through `wattlab record --auto-markers=layers`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="layer markers need PyTorch")

import wattlab  # noqa: E402
from tests.layer_models import small_cnn  # noqa: E402
from wattlab.analysis.energy.source_energy import phases_from_markers  # noqa: E402
from wattlab.integrations import PhaseEmitter  # noqa: E402
from wattlab.integrations.layer_marks import mark_layers  # noqa: E402

LEAVES = 9  # small_cnn's leaf modules


def train(model: torch.nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(2, 3, 16, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


# system: over a second (torch's import and five training steps: 3.5-5 s measured)
@pytest.mark.system
def test_phases_per_layer_on_every_nth_step() -> None:
    seen: list[tuple[str, str, dict[str, object]]] = []
    clock = iter(range(10**9))
    emitter = PhaseEmitter(mark=lambda name, kind, **p: seen.append((name, kind, p)),
                           stamp=lambda: next(clock))
    model = small_cnn()
    marks = mark_layers(model, every_n_steps=2, emitter=emitter)
    try:
        train(model, 5)
    finally:
        marks.remove()
    begins = [(n, p) for n, k, p in seen if k == "begin"]
    per_step = 2 * LEAVES  # forward and backward
    assert sorted({p["step"] for _, p in begins}) == [0, 2, 4]
    assert len(begins) == 3 * per_step == marks.phases
    step0 = [n for n, p in begins if p["step"] == 0]
    assert step0[0] == "0:forward" and step0[-1] == "0:backward" and "8:backward" in step0
    ends = [p["at"] for n, k, p in seen if k == "end"]
    starts = [p["at"] for _, p in begins]
    assert all(e > s for s, e in zip(starts, ends, strict=True))
    assert model[2].inplace  # restored


CHILD = textwrap.dedent("""
    import torch
    from wattlab.acquisition.markers import gpu_marks
    from wattlab.acquisition.markers import program_markers as markers
    from wattlab.hardware.fake_cuda_events import FakeCudaEvents
    from tests.layer_models import small_cnn

    gpu_marks.install(FakeCudaEvents(min_queue_ns=100_000), markers._send)
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        model(torch.randn(2, 3, 16, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
""")


@pytest.mark.system
def test_record_auto_markers_layers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(CHILD)
    out = tmp_path / "run.h5"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{Path(wattlab.__file__).resolve().parents[1]}:{root}",
           "WATTLAB_LAYER_EVERY": "2"}
    result = subprocess.run([sys.executable, "-m", "wattlab.cli", "record", "--simulate",
                             "--auto-markers=layers", "-o", str(out), "--", sys.executable,
                             str(script)], env=env, capture_output=True, text=True, timeout=120,
                            check=False, cwd=root)
    assert result.returncode == 0, result.stderr
    with wattlab.open(str(out)) as run:
        marks = [m for m in run.markers if m.source.startswith("pid")]
    layer = [m for m in marks if ":" in m.name]
    assert layer and all(m.gpu_time_ns is not None for m in layer)
    phases = list(phases_from_markers(layer))
    assert len(phases) == 2 * 2 * LEAVES  # steps 0 and 2 of 4, forward and backward
    names = {p.name for p in phases}
    assert "0.Conv2d:forward" in names and "8.Linear:backward" in names
    assert all(p.duration_s >= 0 for p in phases)
