"""A full disk while recording: real small file systems (tmpfs) and ``ulimit -f``.

tmpfs needs ``mount`` (root, or a CI that allows it): where it cannot be mounted those
cases skip and the ``RLIMIT_FSIZE`` cases (set in the recorder's own process; EFBIG, as
Python ignores SIGXFSZ) still fill a real file. Every case checks: no traceback, the
right exit status, the file opens in plain h5py, every row the recorder confirmed as on
disk before the failure is there, and the lost span is stated.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import Spawn
from tests.test_faults_recorder import ROWS, batch, descriptor
from tests.test_faults_session import wait_for_rows
from wattlab.acquisition.meters.disk_budget import DataRate, estimate, judge, nvml_streams
from wattlab.acquisition.session.live import SpaceWatch, space_note
from wattlab.cli import main
from wattlab.hardware.virtual_bench import VirtualBench
from wattlab.sync.bus.publisher import BusPublisher, local_endpoint
from wattlab.sync.recorder.disk_full import (
    DISK_FULL_EXIT,
    DiskFullReport,
    disk_full_error,
    read_report,
    reserve_path,
)

MIB = 1 << 20


def _try_mount(folder: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True)
    return done.returncode == 0


@contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A real small file system at ``folder`` (skips where mounting is not allowed)."""
    folder.mkdir(exist_ok=True)
    if not _try_mount(folder, size):
        pytest.skip("cannot mount a tmpfs here (not root, or no mount in this container)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> None:
    """Take every free byte of the file system, the way another writer would.

    By writes until ENOSPC, not one ``posix_fallocate`` of the free space: on tmpfs that
    is all or nothing, and the recorder writing in between made it allocate nothing
    (the recorder then never saw a full disk, ~1 run in 10).
    """
    with open(folder / "filler", "wb", buffering=0) as f:
        for size in (1 << 20, 4096):  # whole MiB, then what pages are left
            block = bytes(size)
            with contextlib.suppress(OSError):
                while True:
                    f.write(block)


def fsize_limit(limit_bytes: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


def assert_clean_stop(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if "disk full at" in line]
    assert len(lines) == 1, stderr
    assert "recording stopped; the file holds" in lines[0]


def assert_plain_readable(path: Path) -> dict[str, int]:
    """Opens without SWMR and with every dataset of a stream the same length."""
    rows = {}
    with h5py.File(path, "r") as f:
        for source_id, group in f["sources"].items():
            lengths = {group[name].shape[0] for name in ("time", "time_raw", "values", "flags")}
            assert len(lengths) == 1, (source_id, lengths)
            t = group["time"][:]
            assert np.all(np.diff(t) > 0), source_id
            rows[source_id] = int(t.size)
    return rows


# ---- the recorder process alone, a publisher sending numbered rows ----------------------

@dataclass
class Stopped:
    """A recorder process that stopped on a full disk, and what its publisher saw."""

    code: int
    out: str
    err: str
    sent: int  # rows
    confirmed: int  # rows the recorder said were on disk


def record_until_full(path: Path, preexec: Callable[[], None] | None = None,
                      filler: Path | None = None) -> Stopped:
    """Send ~40 k rows/s until the recorder stops.

    With ``filler``, after 1 s the sending pauses until the recorder has every row on disk,
    the filler takes the free space, and the sending resumes: the recorder, idle meanwhile,
    meets the full disk at its next write, always after the fill. Filling while it wrote
    left the outcome to the scheduler (a quick failure ~1 run in 30, message not kept):
    whether anything was confirmed before the fill, and whether the recorder met ENOSPC
    mid-fill and freed its reserve for the still-running filler to take.
    """
    endpoint = local_endpoint()
    from wattlab.sync.recorder.process import RecorderConfig

    # with a filler, SWMR from the first flush: its switch later would be a write mid-fill
    cfg = RecorderConfig(endpoint=endpoint, output=str(path), session_start_ns=0,
                         root_attrs={"command": "[]"}, flush_interval_s=0.2,
                         swmr_after_s=0.0 if filler is not None else RecorderConfig.swmr_after_s)
    recorder = subprocess.Popen([sys.executable, "-m", "wattlab.sync.recorder", cfg.to_json()],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=preexec)
    pub = BusPublisher(endpoint, linger_ms=0, backlog_bytes=64 << 20)
    seq = 0
    try:
        pub.announce(descriptor())
        pub.wait_ready(20)
        deadline = time.monotonic() + 30
        started = time.monotonic()
        while recorder.poll() is None and time.monotonic() < deadline:
            pub.send_batch(batch(seq))
            pub.flush()
            seq += 1
            if filler is not None and time.monotonic() - started > 1.0:
                assert pub.wait_durable(20), "the recorder confirmed nothing for 20 s"
                fill(filler)
                filler = None
            time.sleep(0.005)
            pub.serve_requests()
        confirmed = pub.durable_seq("meter") * ROWS
    finally:
        pub.close(wait=False)
        try:
            out, err = recorder.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            recorder.kill()  # fail this test alone: no live recorder or open pipe left behind
            recorder.communicate()
            raise
    return Stopped(recorder.returncode, out.decode(), err.decode(), seq * ROWS, confirmed)


def check_recorder_stop(path: Path, stopped: Stopped) -> DiskFullReport:
    assert stopped.code == DISK_FULL_EXIT, stopped.err
    assert_clean_stop(stopped.err)
    report = read_report(stopped.out)
    assert report is not None, stopped.out
    sent, confirmed = stopped.sent, stopped.confirmed
    rows = assert_plain_readable(path)["meter"]
    with h5py.File(path, "r") as f:
        index = f["sources/meter/values"][:, 1]
    np.testing.assert_array_equal(index, np.arange(rows))  # whole, in order, nothing made up
    assert confirmed <= rows < sent, (confirmed, rows, sent)
    assert confirmed > 0
    [span] = report.spans
    assert span.source == "meter"
    assert span.last_row_s is not None and span.last_row_s <= report.failed_at_s
    assert not os.path.exists(reserve_path(str(path)))
    return report


@pytest.mark.system
@pytest.mark.parametrize("limit_mb", [3.0, 6.0])
def test_recorder_stops_cleanly_at_a_file_size_limit(tmp_path, limit_mb):
    path = tmp_path / "run.h5"
    report = check_recorder_stop(path, record_until_full(path, fsize_limit(int(limit_mb * MIB))))
    assert report.error == "EFBIG"
    assert os.path.getsize(path) <= limit_mb * MIB


@pytest.mark.system
@pytest.mark.parametrize("size", ["5m", "8m"])
def test_recorder_stops_cleanly_on_a_full_tmpfs(tmp_path, size):
    with tmpfs(tmp_path / "small", size) as folder:
        path = folder / "run.h5"
        report = check_recorder_stop(path, record_until_full(path))
        assert report.error == "ENOSPC" and report.finished and report.in_gaps, report
        with h5py.File(path, "r") as f:
            [gap] = [g for g in f["gaps"][:] if g["reason"].startswith(b"disk full")]
            assert gap["source"] == b"meter" and gap["time_last"] > gap["time_first"]
            assert f.attrs["stopped_by"] == "disk full (ENOSPC)"


@pytest.mark.system
def test_recorder_stops_when_another_writer_fills_the_disk(tmp_path):
    with tmpfs(tmp_path / "small", "64m") as folder:
        path = folder / "run.h5"
        report = check_recorder_stop(path, record_until_full(path, filler=folder))
        assert report.error == "ENOSPC" and report.in_gaps, report


# ---- whole sessions through the CLI ------------------------------------------------------

def cli(spawn: Spawn, *args: str) -> subprocess.Popen[bytes]:
    return spawn([sys.executable, "-m", "wattlab.cli", *args],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.system
@pytest.mark.parametrize(("verb", "fill_after_s"), [
    ("record", 0.0), ("record-processes", 1.0), ("demo", 0.5), ("demo", 2.0)])
def test_session_stops_cleanly_when_the_disk_fills(tmp_path, verb, fill_after_s, spawn):
    """A fast meter (an emulated PowerSensor3) fills pages quickly: the disk fills soon."""
    with tmpfs(tmp_path / "small", "128m") as folder, VirtualBench(3, 30.0) as bench:
        path = folder / "run.h5"
        if verb == "demo":
            session = cli(spawn, "demo", "--duration", "20", "-o", str(path))
        else:
            extra = ["--source-processes"] if verb == "record-processes" else []
            session = cli(spawn, "record", "--simulate", "--duration", "20", "-o", str(path),
                          "--meter", f"ps3=powersensor3:{bench.ps3_port}", *extra)
        wait_for_rows(path, "gpu0.samples")
        time.sleep(fill_after_s)
        with h5py.File(path, "r", swmr=True, locking=False) as f:  # on disk before the fill
            before = {s: g["time"][:] for s, g in f["sources"].items()}
        time.sleep(1.0)  # two flushes: what was seen is in a complete flush
        fill(folder)
        out, err = session.communicate(timeout=60)
        assert session.returncode == 1, err.decode()
        assert_clean_stop(err.decode())
        assert "restarting" not in err.decode()
        rows = assert_plain_readable(path)
        with h5py.File(path, "r") as f:
            for source_id, times in before.items():
                np.testing.assert_array_equal(f[f"sources/{source_id}/time"][:times.size], times)
                assert rows[source_id] >= times.size
        text = out.decode()
        spans = [line for line in text.splitlines() if "disk full (ENOSPC)" in line]
        assert {line.split()[2].rstrip(":") for line in spans} == set(rows), text
        assert all(" s to " in line for line in spans), text  # the span, from and to


# ---- before recording: the free-space check -----------------------------------------------

@pytest.mark.system
def test_a_demo_onto_2_mb_free_is_refused_before_it_starts(tmp_path):
    with tmpfs(tmp_path / "tiny", "2m") as folder:
        done = subprocess.run([sys.executable, "-m", "wattlab.cli", "demo", "-o",
                               str(folder / "d.h5")], capture_output=True, timeout=60)
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert "at least a minute is needed" in err and "MB free" in err
        assert os.listdir(folder) == []  # no run file, no reserve


@pytest.mark.fast
def test_the_free_space_check_reads_the_target_file_system(tmp_path, monkeypatch, capsys):
    """Without mount: a path whose statvfs says 2 MB free (same decision as above)."""
    real = os.statvfs

    def small(path: str) -> os.statvfs_result:
        if not str(path).startswith(str(tmp_path)):
            return real(path)
        fields = list(real(path))
        fields[0] = fields[1] = 4096  # f_bsize, f_frsize
        fields[4] = 512  # f_bavail: 2 MB
        return os.statvfs_result(fields)

    monkeypatch.setattr(os, "statvfs", small)
    assert main(["demo", "-o", str(tmp_path / "d.h5")]) == 2
    assert "2.0 MB free" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.mark.fast
def test_free_space_decisions():
    demo = estimate([*nvml_streams(1, "all"), "powersensor3", "wt300e"])
    assert 1.2 * MIB < demo.bytes_per_s < 1.5 * MIB  # what the demo writes (measured)
    minute = demo.bytes_for(60)
    assert judge(minute - 1, demo, 10, None).level == "refuse"
    assert judge(minute + 1, demo, 60, None).level == "ok"
    assert judge(minute + 1, demo, 600, None).level == "warn"
    assert judge(minute + 1, demo, None, None).level == "warn"  # under five minutes
    assert judge(demo.bytes_for(301), demo, None, None).level == "ok"
    assert judge(demo.bytes_for(301), demo, None, 10_000).level == "warn"  # --min-free-mb
    few = estimate(nvml_streams(2, "samples,energy"))
    assert few.fixed_bytes == 4 * estimate(["nvml.samples"]).fixed_bytes
    assert "start" in judge(MIB, DataRate(0.0, 8 * MIB), None, None).message


@pytest.mark.fast
def test_disk_full_errors_are_recognised():
    hdf5 = RuntimeError("Unable to synchronously flush file (file write failed: errno = 28, "
                        "error message = 'No space left on device')")
    assert disk_full_error(hdf5) == "ENOSPC"
    assert disk_full_error(OSError(122, "Disk quota exceeded")) == "EDQUOT"
    try:
        try:
            raise OSError(27, "File too large")
        except OSError as e:
            raise ValueError("wrapped") from e
    except ValueError as wrapped:
        assert disk_full_error(wrapped) == "EFBIG"
    assert disk_full_error(RuntimeError("errno = 5, Input/output error")) is None


@pytest.mark.fast
def test_live_panel_shows_free_space_only_when_low():
    assert space_note(10 * 1024 * MIB, 1.4 * MIB) == ""
    assert space_note(100 * MIB, 0.0) == "disk: 100.0 MB free"
    assert space_note(100 * MIB, 1.0 * MIB) == "disk: 100.0 MB free, full in ~100 s at 1.00 MB/s"
    assert space_note(900 * MIB, 1.0 * MIB) == ""  # 15 min left: plenty
    assert space_note(300 * MIB, 0.1 * MIB).endswith("~50 min at 102.4 kB/s")  # under 512 MB


@pytest.mark.system
def test_live_panel_reads_the_free_space_beside_the_run(tmp_path):
    with tmpfs(tmp_path / "small", "8m") as folder:
        path = folder / "run.h5"
        path.write_bytes(b"\0" * MIB)
        watch = SpaceWatch(str(path))
        assert watch.poll() == "disk: 7.0 MB free"  # not growing yet: no time left to say
        with open(path, "ab") as f:
            f.write(b"\0" * MIB)
        time.sleep(0.2)
        note = watch.poll()
        assert note.startswith("disk: 6.0 MB free, full in ~") and note.endswith("MB/s"), note
