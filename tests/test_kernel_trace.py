"""Per-layer GPU time from a profiler trace: attribution, steps, the plain run's idle time.

Synthetic traces (written as real JSON files, plain and gzip) check the attribution rules
against a known answer; the trimmed real trace (tests/data/layers/) checks that a real
PyTorch/Kineto trace reads as the rules expect.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.data_files import LAYERS_CAPTURE
from wattlab.errors import UsageError
from wattlab.layers.in_step import BETWEEN
from wattlab.layers.kernel_trace import (
    IDLE,
    TraceError,
    busy_layout,
    layer_times,
    match_steps,
    mean_layout,
    read_trace,
    split_steps,
    template,
)

pytestmark = pytest.mark.fast

MAIN, AUTOGRAD = 10, 11


class TraceBuilder:
    """A Kineto-like trace: ranges on host threads, launches, kernels linked by correlation."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0

    def range(self, name: str, tid: int, ts: float, dur: float) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1,
                            "tid": tid, "ts": ts, "dur": dur})

    def kernel(self, name: str, tid: int, launch_us: float, start_us: float, dur_us: float,
               cat: str = "kernel") -> None:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                            "pid": 1, "tid": tid, "ts": launch_us, "dur": 2,
                            "args": {"correlation": self.corr}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7,
                            "ts": start_us, "dur": dur_us, "args": {"correlation": self.corr}})

    def write(self, path: Path) -> Path:
        data = json.dumps({"baseTimeNanoseconds": 1_700_000_000_000_000_000,
                           "traceEvents": self.events})
        if path.suffix == ".gz":
            with gzip.open(path, "wt") as f:
                f.write(data)
        else:
            path.write_text(data)
        return path


def one_step(b: TraceBuilder, t0: float, *, ranges: bool = True, gap_us: float = 0.0,
             step_range: bool = False) -> None:
    """conv (forward) holding a nested bn, a loss outside, backward on autograd's thread.

    GPU: k_conv 100 µs, k_bn 50, k_loss 10 (between), k_bn_bw 40, k_conv_bw 200; ``gap_us``
    of idle before each kernel (the host's pace).
    """
    if step_range:
        b.range("wl:step", MAIN, t0, 900)
    if ranges:
        b.range("wl:conv:forward", MAIN, t0 + 1, 300)
        b.range("wl:bn:forward", MAIN, t0 + 100, 100)
        b.range("wl:bn:backward", AUTOGRAD, t0 + 500, 50)
        b.range("wl:conv:backward", AUTOGRAD, t0 + 600, 100)
    gpu = t0 + 50
    for name, tid, launch, dur in (("k_conv", MAIN, t0 + 20, 100), ("k_bn", MAIN, t0 + 150, 50),
                                   ("k_conv2", MAIN, t0 + 250, 30), ("k_loss", MAIN, t0 + 400, 10),
                                   ("k_bn_bw", AUTOGRAD, t0 + 520, 40),
                                   ("memset", AUTOGRAD, t0 + 610, 1),
                                   ("k_conv_bw", AUTOGRAD, t0 + 620, 200)):
        gpu += gap_us
        b.kernel(name, tid, launch, gpu, dur, "gpu_memset" if name == "memset" else "kernel")
        gpu += dur


def synthetic(tmp_path: Path, steps: int = 3, **kw: Any) -> Path:
    b = TraceBuilder()
    for k in range(steps):
        one_step(b, 1000.0 * k, **kw)
    return b.write(tmp_path / "hooked.json.gz")


def test_kernels_go_to_the_innermost_range_on_their_launching_thread(tmp_path: Path) -> None:
    trace = read_trace(synthetic(tmp_path))
    steps = split_steps(trace)
    assert len(steps) == 3  # each begin of the first leaf's forward (conv)
    keys = [(a.name, a.key) for a in steps[0]]
    assert keys == [("k_conv", "conv:forward"), ("k_bn", "bn:forward"),
                    ("k_conv2", "conv:forward"), ("k_loss", BETWEEN),
                    ("k_bn_bw", "bn:backward"), ("memset", "conv:backward"),
                    ("k_conv_bw", "conv:backward")]
    t = layer_times(steps)
    assert t.time_s["conv:forward"] == pytest.approx(130e-6)
    assert t.time_s["conv:backward"] == pytest.approx(201e-6)
    assert t.time_s[BETWEEN] == pytest.approx(10e-6)
    assert t.busy_s == pytest.approx(431e-6) and t.time_se_s["bn:forward"] == 0.0
    assert t.idle_s == pytest.approx(1000e-6 - 431e-6)  # the next step starts 1 ms later
    assert t.period_s == pytest.approx(1000e-6)
    assert t.steps == 3


def test_step_ranges_set_the_steps_when_present(tmp_path: Path) -> None:
    b = TraceBuilder()
    one_step(b, 0.0, step_range=True)
    one_step(b, 1000.0, step_range=True)
    b.range("wl:other:forward", MAIN, 1500.0, 10)  # a later first-leaf begin must not split
    b.range("wl:conv:forward", MAIN, 1700.0, 10)
    trace = read_trace(b.write(tmp_path / "t.json"))
    assert trace.step_starts_us == [0.0, 1000.0]
    assert [len(s) for s in split_steps(trace)] == [7, 7]


def test_plain_run_matched_by_kernel_sequence_gives_the_idle_time(tmp_path: Path) -> None:
    hooked = split_steps(read_trace(synthetic(tmp_path)))
    reference = template(hooked)
    b = TraceBuilder()
    b.kernel("warmup", MAIN, 0.0, 0.0, 5)  # not part of a step: skipped by the matching
    for k in range(4):
        one_step(b, 1000.0 + 2000.0 * k, ranges=False, gap_us=20.0)
    plain = read_trace(b.write(tmp_path / "plain.json"), ranges=False)
    matched = match_steps(plain, reference)
    assert len(matched) == 4
    assert [a.key for a in matched[0]] == [a.key for a in reference]
    times = layer_times(matched)
    assert times.busy_s == pytest.approx(431e-6)
    assert times.idle_s == pytest.approx(2000e-6 - 431e-6)
    layout = mean_layout(matched)
    share = {k: 0.0 for k in layout.keys}
    for k, a, e in zip(layout.keys, layout.start, layout.end, strict=True):
        share[k] += e - a
    assert share[IDLE] == pytest.approx(1 - 431 / 2000)
    assert share["conv:backward"] == pytest.approx(201 / 2000)
    assert layout.start[0] == 0 and layout.end[-1] == pytest.approx(1.0)
    busy = busy_layout(reference)
    assert IDLE not in busy.keys and busy.end[-1] == pytest.approx(1.0)


def test_plain_run_with_other_kernels_matches_nothing(tmp_path: Path) -> None:
    reference = template(split_steps(read_trace(synthetic(tmp_path))))
    b = TraceBuilder()
    for k in range(3):
        b.kernel("other", MAIN, 10.0 * k, 10.0 * k, 5)
    assert match_steps(read_trace(b.write(tmp_path / "p.json"), ranges=False), reference) == []


def test_real_trace_reads_into_three_identical_steps() -> None:
    path = LAYERS_CAPTURE / "vgg16b64_3steps_profile.json.gz"
    trace = read_trace(path)
    steps = split_steps(trace)
    assert len(steps) == 3
    assert len({tuple(a.name for a in s) for s in steps}) == 1
    raw = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    gpu_us = sum(e["dur"] for e in raw if e["cat"] in ("kernel", "gpu_memset", "gpu_memcpy"))
    times = layer_times(steps)
    assert times.busy_s * 3 == pytest.approx(gpu_us / 1e6)
    ranges = {e["name"][3:] for e in raw if e["cat"] == "user_annotation"}
    assert set(times.time_s) <= ranges | {BETWEEN}
    convs = [k for k in times.time_s if k.startswith("features.0:")]
    assert sorted(convs) == ["features.0:backward", "features.0:forward"]
    assert sum(times.time_s.values()) == pytest.approx(times.busy_s)
    assert times.time_s.get(BETWEEN, 0.0) < 0.01 * times.busy_s  # VGG: little outside layers
    assert 0 <= times.idle_s < times.busy_s and np.isfinite(times.idle_se_s)


@pytest.mark.parametrize(("content", "expect"), [
    (b"{not json", "not a readable profiler trace"),
    (gzip.compress(b"[1, 2]", mtime=0), "no traceEvents"),
    (b"", "not a readable profiler trace"),
])
def test_unreadable_traces_name_the_file(tmp_path: Path, content: bytes, expect: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=expect) as e:
        read_trace(path)
    assert str(path) in str(e.value)


def test_a_trace_without_ranges_or_kernels_is_refused(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.kernel("k", MAIN, 0.0, 1.0, 5)
    with pytest.raises(TraceError, match="no 'wl:' ranges"):
        read_trace(b.write(tmp_path / "noranges.json"))
    b = TraceBuilder()
    b.range("wl:conv:forward", MAIN, 0.0, 10)
    with pytest.raises(TraceError, match="no GPU kernels"):
        read_trace(b.write(tmp_path / "nokernels.json"))
    with pytest.raises(TraceError, match=r"missing|No such file"):
        read_trace(tmp_path / "missing.json")
