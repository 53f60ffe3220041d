"""Live view: following a run file while a real recorder writes it, and the CLI verb."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from tests.conftest import Spawn
from wattlab.acquisition.session.live import RunFollower, follow, live_panel, sparkline
from wattlab.analysis.energy.run_summary import summarise
from wattlab.cli import main
from wattlab.runfile.reader import Run, SourceView
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Channel, Gap, SourceDescriptor

T0 = 5_000_000_000
S = 1_000_000_000


def write_run(path: Path, finished: bool = True) -> None:
    writer = RunFileWriter(str(path), {}, T0)
    writer.add_source(SourceDescriptor("meter", "powersensor3", "PS3",
                                       (Channel("power_w", "W"),)))
    writer.add_source(SourceDescriptor("gpu0.energy", "nvml", "GPU", (Channel("energy_j", "J"),)))
    t = T0 + np.arange(0, 2 * S, S // 1000, dtype=np.int64)  # 1 kHz for 2 s at 250 W
    writer.append("meter", t, t, np.full((t.size, 1), 250.0), np.zeros(t.size, np.uint8))
    te = T0 + np.arange(0, 2 * S + 1, S // 10, dtype=np.int64)
    writer.append("gpu0.energy", te, te, (10.0 + 240.0 * (te - T0) / S)[:, None],
                  np.zeros(te.size, np.uint8))
    writer.add_gaps([Gap("meter", "lost", 3, 4, -1, -1, 120)])
    writer.close({"session_end_monotonic_ns": T0 + 2 * S} if finished else None)


@pytest.mark.fast
def test_sparkline_scales_to_its_range() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5.0, 5.0]) == "▁▁"
    assert sparkline([1.0, float("nan"), 2.0]) == "▁ █"
    assert sparkline([]) == ""


@pytest.mark.fast
def test_follower_on_a_finished_file(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    write_run(path)
    with RunFollower(str(path)) as follower:
        statuses = {s.source_id: s for s in follower.poll()}
        assert follower.finished
    meter = statuses["meter"]
    assert meter.samples == 2000 and meter.power_w == 250.0
    assert meter.energy_j == pytest.approx(250.0 * 1.999)
    assert meter.rate_hz == pytest.approx(1000.0, rel=0.01)
    assert (meter.gaps, meter.samples_lost) == (1, 120)
    assert statuses["gpu0.energy"].energy_j == pytest.approx(480.0)
    assert statuses["gpu0.energy"].power_w is None


@pytest.mark.fast
def test_a_stale_handle_is_reopened_and_its_rows_read_then(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """HDF5's "addr overflow" on a live file (its writer reopened it) skips no row."""
    path = tmp_path / "run.h5"
    write_run(path)
    real_slice = SourceView.time_slice
    failures = iter([OSError("Can't synchronously read data (addr overflow)")])

    def stale_once(view: SourceView, start: int, stop: int) -> np.ndarray:
        if (error := next(failures, None)) is not None:
            raise error
        return real_slice(view, start, stop)

    monkeypatch.setattr(SourceView, "time_slice", stale_once)
    with RunFollower(str(path)) as follower:
        first = {s.source_id: s for s in follower.poll()}
        again = {s.source_id: s for s in follower.poll()}
    assert all(status.samples == 0 for status in first.values())  # none from the stale handle
    assert again["meter"].samples == 2000
    assert again["meter"].energy_j == pytest.approx(250.0 * 1.999)


@pytest.mark.fast
def test_follow_stops_on_event_and_waits_for_the_file(tmp_path: Path) -> None:
    path = tmp_path / "unfinished.h5"
    write_run(path, finished=False)
    stop = threading.Event()
    stop.set()
    statuses = follow(str(path), console=Console(file=io.StringIO()), stop=stop)
    assert {s.source_id for s in statuses} == {"meter", "gpu0.energy"}
    assert main(["live", str(tmp_path / "never.h5"), "--wait", "0.2", "--interval", "0.05"]) == 2


@pytest.mark.system
def test_live_follows_a_real_recording(tmp_path: Path, spawn: Spawn) -> None:
    """A real recorder in another process; the panel ends when the file is closed."""
    path = tmp_path / "rec.h5"
    recorder = spawn(
        [sys.executable, "-m", "wattlab.cli", "record", "--simulate", "--duration", "1.5",
         "-o", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    try:
        statuses = follow(str(path), console=console, interval_s=0.2, wait_s=20)
    finally:
        _out, err = recorder.communicate(timeout=30)
    assert recorder.returncode == 0, err.decode()
    shown = buffer.getvalue()
    assert "recording" in shown and "finished" in shown and "gpu0.samples" in shown
    with Run(str(path)) as run:
        expected = {s.source_id: s for s in summarise(run)}
    for status in statuses:
        if status.energy_j is not None and status.source_id in expected:
            assert status.samples == expected[status.source_id].samples
            assert status.energy_j == pytest.approx(expected[status.source_id].energy_j,
                                                    rel=1e-6)


@pytest.mark.fast
def test_cli_live_is_quiet_when_not_a_terminal(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.h5"
    write_run(path)
    assert main(["live", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out and "┃" not in out
    assert out.splitlines()[0].startswith("source")
    assert "meter" in out and "499.8" in out


@pytest.mark.fast
def test_live_panel_draws_in_a_thread_and_stops(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    with live_panel(str(path), enabled=True, interval_s=0.05, console=console) as errors:
        write_run(tmp_path / "staging.h5")
        (tmp_path / "staging.h5").rename(path)  # the file appears while the panel waits
        deadline = time.monotonic() + 5
        while "finished" not in buffer.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert errors == []
    assert "finished" in buffer.getvalue() and "meter" in buffer.getvalue()
    assert not any(t.name == "wattlab-live" for t in threading.enumerate())
    with live_panel(str(path), console=Console(file=io.StringIO())) as errors:
        assert not any(t.name == "wattlab-live" for t in threading.enumerate())


@pytest.mark.system
def test_live_on_a_file_whose_recorder_is_gone_says_so_instead_of_waiting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recorder that died without closing its file: no more rows will come."""
    path = tmp_path / "left.h5"
    child = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent.parent)!r}); "
             f"from tests.test_live import write_run; from pathlib import Path; "
             f"write_run(Path({str(path)!r}), finished=False)")
    subprocess.run([sys.executable, "-c", child], check=True, timeout=60)
    started = time.monotonic()
    assert main(["live", "--interval", "0.1", str(path)]) == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert "recorder is gone" in err and f"wattlab repair {path}" in err
    # while its writer still runs (this process), the same kind of file is followed
    alive = tmp_path / "alive.h5"
    write_run(alive, finished=False)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    statuses = follow(str(alive), console=Console(file=io.StringIO()), interval_s=0.1,
                      stop=stop)
    assert {s.source_id for s in statuses} >= {"meter"}


SAYS_AT_ONCE_S = 20.0  # far below the --wait below: a line only at the deadline fails


@pytest.mark.system
def test_live_says_at_once_what_it_waits_for(tmp_path: Path, spawn: Spawn) -> None:
    import select

    path = tmp_path / "nosuch.h5"
    proc = spawn([sys.executable, "-m", "wattlab.cli", "live", str(path), "--wait", "120"],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    ready, _, _ = select.select([proc.stderr], [], [], SAYS_AT_ONCE_S)
    assert ready, f"live said nothing within {SAYS_AT_ONCE_S} s of a --wait of 120 s"
    line = proc.stderr.readline()
    assert f"waiting up to 120 s for {path}" in line and "wattlab record" in line, line
    assert proc.poll() is None  # still waiting


@pytest.mark.fast
def test_live_refuses_a_run_file_in_a_folder_that_does_not_exist(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "no-such-folder" / "run.h5"
    assert main(["live", str(path), "--wait", "60"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'no-such-folder'}" in err and "does not exist" in err, err
