"""GPU-timed markers: the clock pairing, the resolver, /markers columns, analysis on GPU time.

No GPU here: ``FakeCudaEvents`` stands in for CUDA events (a GPU clock with its own offset
and drift, running behind the host by the work queued on its stream). The real-GPU check
is tests/with_device/test_gpu_markers.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import wattlab
from tests.conftest import free_port
from tests.data_files import data_file
from wattlab.acquisition.markers import gpu_marks
from wattlab.acquisition.markers.gpu_marks import GpuMarkResolver, Stamp
from wattlab.acquisition.markers.gpu_timebase import GpuClock
from wattlab.analysis.energy.source_energy import energy_report, phases_from_markers
from wattlab.errors import UsageError
from wattlab.hardware.fake_cuda_events import FakeCudaEvents
from wattlab.integrations import PhaseEmitter
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Marker, SourceDescriptor

MS = 1_000_000
SAMPLES_STREAM = ("gpu0.samples", "power_w")


@pytest.mark.fast
def test_pairing_recovers_when_the_gpu_ran_each_event_within_its_uncertainty() -> None:
    fake = FakeCudaEvents(drift_ppm=80.0, min_queue_ns=50_000)
    clock = GpuClock(fake)
    assert 0 < clock.pairings[-1].half_width_ns < 5 * MS  # measured, not assumed
    events = []
    for _ in range(5):
        fake.launch(30 * MS)  # the host queues 30 ms of work and moves on at once
        events.append((time.monotonic_ns(), fake.record()))
    for _, ev in events:
        fake.wait(ev)
    clock.refresh()
    # host ns per GPU ns, minus one: this GPU timer runs 80 ppm fast
    assert clock.drift == pytest.approx(1 / (1 + 80e-6) - 1, abs=clock.drift_uncertainty)
    for recorded_ns, ev in events:
        t_ns, unc_ns = clock.to_host(ev, recorded_ns)
        assert abs(t_ns - ev.true_host_ns) <= unc_ns
        assert unc_ns < 5 * MS
    # the GPU ran the last boundary ~150 ms after the host recorded it
    last_recorded, last = events[-1]
    assert clock.to_host(last, last_recorded)[0] - last_recorded > 120 * MS


@pytest.mark.fast
def test_resolver_queues_without_waiting_and_sends_both_times() -> None:
    fake = FakeCudaEvents(min_queue_ns=100_000)
    sent: list[Marker] = []
    resolver = GpuMarkResolver(fake, sent.append, refresh_s=0.01)
    fake.launch(80 * MS)
    t0 = time.perf_counter()
    stamp = resolver.stamp()
    resolver.submit(Marker(stamp.host_ns, "step", "end"), stamp)
    queued_s = time.perf_counter() - t0
    assert queued_s < 0.02 and not fake.done(stamp.event)  # the host did not wait for the GPU
    later = [resolver.stamp() for _ in range(3)]
    for i, s in enumerate(later):
        resolver.submit(Marker(s.host_ns, f"p{i}"), s)
    resolver.close()
    assert [m.name for m in sent] == ["step", "p0", "p1", "p2"]
    first = sent[0]
    assert first.t_gpu_ns is not None and first.gpu_uncertainty_ns is not None
    assert first.t_gpu_ns - first.t_host_ns > 60 * MS
    assert abs(first.t_gpu_ns - stamp.event.true_host_ns) <= first.gpu_uncertainty_ns
    for m, s in zip(sent[1:], later, strict=True):  # they ran once the 80 ms were done
        assert abs(m.t_gpu_ns - s.event.true_host_ns) <= m.gpu_uncertainty_ns
        assert s.event.true_host_ns == stamp.event.true_host_ns


@pytest.mark.system
def test_gpu_true_without_cuda_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATTLAB_BUS", f"tcp://127.0.0.1:{free_port()}")
    monkeypatch.setattr(gpu_marks, "_active", None)
    monkeypatch.setattr(gpu_marks, "_cuda_ready", lambda: False)
    with pytest.raises(UsageError, match="gpu=True"):
        wattlab.mark("x", gpu=True)
    assert gpu_marks.resolver(None, print) is None  # automatic: host time, no error
    assert gpu_marks.resolver(False, print) is None


@pytest.mark.system
def test_optimizer_steps_become_step_phases_between_them() -> None:
    marks: list[tuple[str, str, dict[str, object]]] = []

    def rec(name: str, kind: str = "point", **payload: object) -> None:
        marks.append((name, kind, payload))

    stamps = iter(range(100))
    em = PhaseEmitter(1, rec, stamp=lambda: Stamp(next(stamps)))
    torch = pytest.importorskip("torch")
    from wattlab.integrations.torch_helper import mark_optimizer_steps

    hook = mark_optimizer_steps(emitter=em)
    try:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.step()
    finally:
        hook.remove()
    spans = [(k, p["at"].host_ns) for n, k, p in marks if n == "step"]
    assert spans == [("begin", 0), ("end", 1), ("begin", 1), ("end", 2)]
    assert [p["step"] for n, k, p in marks if n == "step" and k == "begin"] == [1, 2]
    assert [p["step"] for n, _, p in marks if n == "optimizer_step"] == [0, 1, 2]


# ----------------------------------------------------------------------------- run files


def _power_run(path: Path, markers: list[Marker], busy: list[tuple[int, int]]) -> None:
    """50 Hz samples at 100 W, 700 W inside the ``busy`` windows (ns)."""
    w = RunFileWriter(str(path), {}, 0)
    t = np.arange(0, 5_001, 20) * MS
    p = np.full(t.size, 100.0)
    for a, b in busy:
        p[(t >= a) & (t < b)] = 700.0
    w.add_source(SourceDescriptor("gpu0.samples", "nvml", "m", (Channel("power_w", "W"),)))
    w.append("gpu0.samples", t, t, p.reshape(-1, 1), np.zeros(t.size, np.uint8))
    w.add_markers(markers)
    w.close()


def _steps(n: int, lag_ns: int, queued_ns: int = 3 * MS) -> list[Marker]:
    """Steps the host queued in 3 ms each, run by the GPU ``lag_ns`` later for 400 ms."""
    out = []
    for i in range(n):
        host, gpu0 = 1000 * MS + i * queued_ns, 1000 * MS + i * 400 * MS + lag_ns
        out += [Marker(host, "step", "begin", "pid1", {"step": i}, gpu0, 20_000),
                Marker(host + queued_ns, "step", "end", "pid1", {}, gpu0 + 400 * MS, 20_000)]
    return out


@pytest.mark.fast
def test_markers_store_host_and_gpu_time_and_energy_uses_the_gpu_time(tmp_path: Path) -> None:
    path = tmp_path / "gpu.h5"
    markers = _steps(5, lag_ns=100 * MS)
    _power_run(path, markers, [(1100 * MS, 3100 * MS)])
    with h5py.File(path) as f:
        table = f["markers"][:]
    assert table["time"][0] == 1000 * MS and table["time_gpu"][0] == 1100 * MS
    assert table["time_gpu_uncertainty"][0] == 20_000
    with wattlab.open(str(path)) as run:
        rows = run.markers
        rep = energy_report(run, by_marker=True)
    assert rows[1].time_ns == 1003 * MS and rows[1].gpu_time_ns == 1500 * MS
    steps = [p for p in rep["phases"] if p["name"] == "step"]
    assert [p["clock"] for p in steps] == ["gpu"] * 5
    assert steps[0]["t1_s"] - steps[0]["t0_s"] == pytest.approx(0.4)
    energies = [r["energy_j"] for r in rep["rows"] if r["phase"].startswith("step")]
    assert energies == pytest.approx([280.0] * 5, rel=0.06)  # 700 W x 0.4 s, not 3 ms of it


@pytest.mark.fast
def test_files_without_gpu_columns_still_read(tmp_path: Path) -> None:
    """A run file from before GPU markers: /markers has the six host-time columns only."""
    path = tmp_path / "old.h5"
    _power_run(path, [], [])
    old = np.dtype([("time", "<i8"), ("time_raw", "<i8"), ("kind", "S5"), ("source", "S64"),
                    ("name", "S128"), ("payload", "S1024")])
    with h5py.File(path, "r+") as f:
        del f["markers"]
        rows = np.array([(100 * MS, 100 * MS, b"begin", b"pid1", b"a", b"{}"),
                         (900 * MS, 900 * MS, b"end", b"pid1", b"a", b"{}")], dtype=old)
        f.create_dataset("markers", data=rows, maxshape=(None,), chunks=(64,))
    with wattlab.open(str(path)) as run:
        markers = run.markers
    assert [m.gpu_time_ns for m in markers] == [None, None]
    (phase,) = phases_from_markers(markers)
    assert (phase.t0_s, phase.t1_s, phase.clock) == (0.1, 0.9, "host")


@pytest.mark.fast
def test_host_only_markers_write_unknown_gpu_time(tmp_path: Path) -> None:
    path = tmp_path / "host.h5"
    _power_run(path, [Marker(5 * MS, "p")], [])
    with h5py.File(path) as f:
        row = f["markers"][0]
    assert row["time_gpu"] == np.iinfo(np.int64).min and row["time_gpu_uncertainty"] == -1


# ----------------------------------------------------------------------------- end to end

CHILD = textwrap.dedent("""
    import time
    import wattlab
    from wattlab.acquisition.markers import gpu_marks
    from wattlab.acquisition.markers import program_markers as markers
    from wattlab.hardware.fake_cuda_events import FakeCudaEvents
    from wattlab.integrations.torch_helper import steps

    fake = FakeCudaEvents(min_queue_ns=200_000)
    gpu_marks.install(fake, markers._send)
    for _ in steps(range(4)):
        fake.launch(60_000_000)   # 60 ms of GPU work queued, the host goes on at once
    with wattlab.phase("host_only", gpu=False):
        time.sleep(0.01)
""")


@pytest.mark.system
def test_record_writes_gpu_times_of_framework_steps(tmp_path: Path) -> None:
    """A real session: the workload's step markers arrive with GPU times after the host's."""
    script = tmp_path / "train.py"
    script.write_text(CHILD)
    out = tmp_path / "run.h5"
    env = {**os.environ, "PYTHONPATH": str(Path(wattlab.__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, "-m", "wattlab.cli", "record", "--simulate",
                             "-o", str(out), "--", sys.executable, str(script)],
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    with wattlab.open(str(out)) as run:
        marks = [m for m in run.markers if m.source.startswith("pid")]
        phases = phases_from_markers(marks)
    steps = [m for m in marks if m.name == "step"]
    assert len(steps) == 8 and all(m.gpu_time_ns is not None for m in steps)
    assert all(0 < (m.gpu_uncertainty_ns or 0) < 5 * MS for m in steps)
    host_span = steps[-1].time_ns - steps[0].time_ns
    gpu_span = steps[-1].effective_ns - steps[0].effective_ns
    assert host_span < 100 * MS and gpu_span >= 230 * MS  # 4 x 60 ms of work, queued at once
    durations = [p.duration_s for p in phases if p.name == "step"]
    assert durations == pytest.approx([0.06] * 4, abs=0.01)
    (host_only,) = [m for m in marks if m.name == "host_only" and m.kind == "begin"]
    assert host_only.gpu_time_ns is None
    info = subprocess.run([sys.executable, "-m", "wattlab.cli", "info", str(out)], env=env,
                          capture_output=True, text=True, timeout=60, check=False).stdout
    assert "(8 on the GPU's time, pairing ± " in info


# ----------------------------------------------------------------------------- resolution


def _epoch_of_steps(step_ms: int, n: int, gap_ms: int = 0) -> list[Marker]:
    """An epoch of ``n`` GPU-timed steps of ``step_ms`` each, ``gap_ms`` apart."""
    t0 = 1000 * MS
    out = [Marker(t0, "epoch", "begin", "pid1", {}, t0, 10_000)]
    for i in range(n):
        a = t0 + i * (step_ms + gap_ms) * MS
        out += [Marker(a, "step", "begin", "pid1", {}, a, 10_000),
                Marker(a, "step", "end", "pid1", {}, a + step_ms * MS, 10_000)]
    end = t0 + n * (step_ms + gap_ms) * MS
    return [*out, Marker(end, "epoch", "end", "pid1", {}, end, 10_000)]


@pytest.mark.fast
def test_steps_too_short_for_the_stream_are_flagged_and_summed_per_epoch(
        tmp_path: Path) -> None:
    path = tmp_path / "short.h5"
    _power_run(path, _epoch_of_steps(30, 40), [(1000 * MS, 2200 * MS)])
    with wattlab.open(str(path)) as run:
        rep = energy_report(run, by_marker=True)
    step = next(r for r in rep["rows"] if r["phase"] == "step#3")
    assert step["resolves"] is False and any("shorter than this stream" in n
                                             for n in step["notes"])
    assert step["edge_s"] == pytest.approx(0.01 + 0.0, abs=1e-6)  # 20 ms spacing, no lag
    (group,) = rep["group_rows"]
    assert group["phase"] == "step per epoch" and group["resolves"] is True
    assert group["energy_j"] == pytest.approx(700.0 * 1.2, rel=0.02)
    chosen = {c["phase"]: c for c in rep["chosen"]}
    assert chosen["step#3"]["stream"] is None and "shorter than any" in chosen["step#3"]["reason"]
    assert chosen["step per epoch"]["stream"] == "gpu0.samples:power_w"
    assert chosen["epoch"]["stream"] == "gpu0.samples:power_w"


@pytest.mark.fast
def test_sparse_short_steps_are_not_summed_and_the_reason_is_said(tmp_path: Path) -> None:
    """Host-time steps: 3 ms windows 200 ms apart say nothing, even all together."""
    path = tmp_path / "sparse.h5"
    _power_run(path, _epoch_of_steps(3, 10, gap_ms=197), [(1000 * MS, 3000 * MS)])
    with wattlab.open(str(path)) as run:
        rep = energy_report(run, by_marker=True)
    assert rep["group_rows"] == []
    assert any("fill only 2 %" in n for n in rep["notes"])


@pytest.mark.system
def test_report_draws_energy_per_instance_from_streams_that_resolve_it(
        tmp_path: Path) -> None:
    from wattlab.analysis.report.html_report import build_report

    resolved, short = tmp_path / "resolved.h5", tmp_path / "short.h5"
    _power_run(resolved, _steps(5, lag_ns=100 * MS), [(1100 * MS, 3100 * MS)])
    _power_run(short, _epoch_of_steps(30, 40), [(1000 * MS, 2200 * MS)])
    got = {}
    for path in (resolved, short):
        result = build_report(str(path), options=None)
        assert result.energy is not None and result.energy.per_instance is not None
        got[path.stem] = result.energy.per_instance
    inst = got["resolved"]
    i, j = inst.names.index("step"), inst.streams.index("gpu0.samples:power_w")
    assert inst.mean_j[i, j] == pytest.approx(280.0, rel=0.06) and inst.count[i, j] == 5
    assert inst.spread_j[i, j] < 0.1 * inst.mean_j[i, j]  # not a sum with wide error bars
    inst = got["short"]
    assert "step" not in inst.names and "step per epoch" in inst.names
    assert inst.unresolved == ["step: gpu0.samples:power_w"]


@pytest.mark.fast
def test_bus_messages_carry_the_gpu_time_and_older_senders_still_decode() -> None:
    import json as _json

    from wattlab.sync.bus import message

    sent = Marker(5, "step", "end", "pid7", {"step": 3}, 9_000, 40)
    frames = message.encode_marker(sent)
    assert message.decode_marker(message.decode_header(frames)) == sent
    head = message.decode_header(message.encode_marker(Marker(5, "step", "end", "pid7")))
    assert "t_gpu_ns" not in _json.dumps(head)  # host-only markers: the old message
    assert message.decode_marker(head).t_gpu_ns is None


@pytest.mark.fast
def test_a_failing_gpu_keeps_host_time_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    class Broken(FakeCudaEvents):
        def elapsed_ns(self, start: object, end: object) -> float:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    sent: list[Marker] = []
    resolver = GpuMarkResolver(Broken(), sent.append)
    for name in ("a", "b"):
        s = resolver.stamp()
        resolver.submit(Marker(s.host_ns, name), s)
    resolver.close()
    assert [(m.name, m.t_gpu_ns) for m in sent] == [("a", None), ("b", None)]
    assert capsys.readouterr().err.count("markers keep host time") == 1


@pytest.mark.system
@pytest.mark.parametrize(("trace", "resolved"), [("torch-long", True), ("lightning", True),
                                                 ("torch-medium", False),
                                                 ("torch-short", False)])
def test_real_h100_steps_are_resolved_by_the_50hz_samples_only_when_long_enough(
        trace: str, resolved: bool) -> None:
    """The H100 traces' synchronised steps (``truth_step``): 172 ms steps are resolved by
    the 50 Hz samples, 29 ms and 2 ms ones are not, and, 90-375 ms apart, not summed."""
    with wattlab.open(str(data_file(f"traces/h100_{trace}.h5"))) as run:
        rep = energy_report(run, by_marker=True)
    rows = [r for r in rep["rows"] if r["phase"].startswith("truth_step")
            and r["source"] == SAMPLES_STREAM[0] and r["channel"] == SAMPLES_STREAM[1]]
    assert rows and {r["resolves"] for r in rows} == {resolved}
    chosen = [c for c in rep["chosen"] if c["phase"].startswith("truth_step")]
    assert all((c["stream"] is not None) == resolved for c in chosen)
    if not resolved:
        assert any("'truth_step' phase(s)" in n and "even summed" in n for n in rep["notes"])
