"""`wattlab repair`: run files a killed writer left, made readable by any HDF5 tool."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

import wattlab
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.runfile.crash_flags import clear_crash_flags, crash_flags
from wattlab.runfile.h5_read import open_read_only
from wattlab.runfile.repair import CUT_OFF_REASON, repair_run, writer_status
from wattlab.runfile.schema import REPAIR_JSON, SOURCES, UNFINISHED, WRITER_JSON
from wattlab.runfile.writer import RunFileWriter

REPO = Path(__file__).resolve().parents[1]
CHUNK_ROWS = 32768  # rows of a 512 KiB chunk of 16-byte rows (the test source's values)

CHILD_HEAD = """
import os, sys
import numpy as np
from wattlab.samples import Channel, SourceDescriptor
from wattlab.runfile.writer import RunFileWriter

path = sys.argv[1]
desc = SourceDescriptor("meter", "test", "Crash 1", (Channel("power_w", "W"),
                        Channel("index", "1")), value_dtype="<f8")
w = RunFileWriter(path, {}, 0)
w.add_source(desc)

def rows(first, n):
    index = np.arange(first, first + n, dtype=np.float64)
    t = 1_000_000 + np.arange(first, first + n, dtype=np.int64) * 1000
    return t, t, np.column_stack([index * 0.5, index]), np.zeros(n, dtype=np.uint8)
"""


def crash_writer(path: Path, body: str, *, flags_left: bool = True) -> None:
    """Run ``body`` after CHILD_HEAD in a process that then dies without closing (``_exit``).

    ``flags_left=False``: ``body`` closed the HDF5 file itself (the writer died between two
    of its closes).
    """
    code = CHILD_HEAD + textwrap.dedent(body) + "\nos._exit(0)\n"
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, cwd=REPO)
    assert (crash_flags(str(path)) != 0) == flags_left


def dataset_lengths(path: Path) -> dict[str, int]:
    with h5py.File(path, "r") as f:  # plain h5py, as any user tool opens it
        group = f["sources/meter"]
        return {name: int(group[name].shape[0]) for name in ("time", "time_raw", "values",
                                                             "flags")}


@pytest.mark.system
def test_torn_tails_are_trimmed_and_every_whole_row_kept(tmp_path):
    """Rows after the last /progress record that every dataset holds are kept; rows in a
    chunk never written, rows sized but blank, and one dataset's overhang are trimmed."""
    path = tmp_path / "torn.h5"
    crash_writer(path, f"""
        w.append("meter", *rows(0, 100))
        w.add_progress([("meter", 1, 100, False)])
        w.flush()
        w.start_swmr()
        w.append("meter", *rows(100, 900))          # whole, but never confirmed
        w.flush()
        group = w._file["sources/meter"]
        n = {CHUNK_ROWS} + 50                        # crosses into the values' next chunk
        t, raw, values, flags = rows(1000, n - 1000)
        for name, data in (("time", t), ("time_raw", raw), ("flags", flags)):
            group[name].resize(n, axis=0)
            group[name][1000:n] = data
        group["values"].resize(n, axis=0)
        group["values"][1000:{CHUNK_ROWS}] = values[:{CHUNK_ROWS} - 1000]  # next chunk: none
        w._file.flush()
    """)
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(path, "r")
    report = repair_run(str(path))
    assert report.repaired and report.crash_flags != 0
    record = report.sources["meter"]
    assert record == {"rows_kept": CHUNK_ROWS, "rows_confirmed": 100,
                      "rows_unconfirmed_kept": CHUNK_ROWS - 100, "rows_trimmed": 50}
    assert dataset_lengths(path) == dict.fromkeys(("time", "time_raw", "values", "flags"),
                                                  CHUNK_ROWS)
    with h5py.File(path, "r") as f:
        index = f["sources/meter/values"][:, 1]
        stored = json.loads(f.attrs[REPAIR_JSON])
        end_ns = int(f.attrs["session_end_monotonic_ns"])
    np.testing.assert_array_equal(index, np.arange(CHUNK_ROWS))  # whole, in order
    assert stored["sources"]["meter"] == record and stored["writer"]["pid"] > 0
    assert end_ns == 1_000_000 + (CHUNK_ROWS - 1) * 1000  # the last row kept
    with wattlab.open(str(path)) as run:
        [gap] = run.gaps
    assert (gap.source, gap.reason) == ("meter", CUT_OFF_REASON)


@pytest.mark.system
def test_a_stream_torn_between_two_resizes_reads_as_its_whole_rows(tmp_path, capsys):
    """A kill between the resizes of a stream's datasets leaves its time column longer
    than its values: readers take the rows every dataset holds (reading past the shortest
    raised "selection + offset not within extent" in `info`, seen in test_repair_kill9)."""
    path = tmp_path / "between_resizes.h5"
    crash_writer(path, """
        w.append("meter", *rows(0, 100))
        w.flush()
        w.start_swmr()
        group = w._file["sources/meter"]
        group["time"].resize(150, axis=0)
        group["time"][100:150] = rows(100, 50)[0]
        w._file.flush()
    """)
    with wattlab.open(str(path)) as run:
        view = run.source("meter")
        assert len(view) == 100 and view.time_ns.size == view.flags.size == 100
        np.testing.assert_array_equal(view.channel("index"), np.arange(100))
    assert main(["info", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["sources"]["meter"]["rows"] == 100


@pytest.mark.system
def test_sized_but_unwritten_rows_are_trimmed(tmp_path):
    path = tmp_path / "blank.h5"
    crash_writer(path, """
        w.append("meter", *rows(0, 10))
        w.add_progress([("meter", 1, 10, False)])
        w.flush()
        w.append("meter", *rows(10, 5))
        w.flush()
        for name in ("time", "time_raw", "values", "flags"):   # sized, then the crash
            w._file["sources/meter"][name].resize(40, axis=0)
        w._file["progress"].resize(3, axis=0)
        w._file.flush()
    """)
    report = repair_run(str(path))
    assert report.sources["meter"]["rows_kept"] == 15
    assert report.sources["meter"]["rows_trimmed"] == 25
    assert report.tables_trimmed == {"markers": 0, "gaps": 0, "progress": 2}
    assert dataset_lengths(path)["time"] == 15


@pytest.mark.system
@pytest.mark.parametrize("swmr", [False, True])
def test_readers_open_a_crash_left_file_without_changing_it(tmp_path, capsys, swmr):
    """Killed before SWMR started (flags 0x1: not even SWMR readers open it) or after:
    wattlab reads it as is, `report` too (it opens plainly first); info says repair."""
    path = tmp_path / "early.h5"
    crash_writer(path, f"""
        w.append("meter", *rows(0, 10))
        w.add_progress([("meter", 1, 10, False)])
        w.flush()
        if {swmr}:
            w.start_swmr()
    """)
    assert crash_flags(str(path)) == (0x5 if swmr else 0x1)
    before = path.read_bytes()
    with wattlab.open(str(path)) as run:
        assert len(run.source("meter")) == 10
    assert main(["report", str(path), "-o", str(tmp_path / "early.html"), "--dpi", "30"]) == 0
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "needs repair" in out and "left open by a recorder that is gone" in out
    assert main(["info", "--json", str(path)]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["needs_repair"] is True and described["writer_alive"] is False
    assert path.read_bytes() == before  # reading changed nothing
    assert main(["repair", str(path)]) == 0
    assert "repaired" in capsys.readouterr().out
    assert main(["info", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["needs_repair"] is False


@pytest.mark.system
def test_a_torn_header_of_a_dead_swmr_writer_is_an_error_not_a_wait(tmp_path, capsys):
    """A writer killed while writing a dataset's header leaves a checksum that fails. SWMR
    readers retry such a read with sleeps doubling up to an hour (HDF5's 100 tries: days);
    the session's salvage waited so in CI. Now the tries are bounded and the error named."""
    path = tmp_path / "torn.h5"
    crash_writer(path, """
        w.append("meter", *rows(0, 10))
        w.add_progress([("meter", 1, 10, False)])
        w.flush()
        w.start_swmr()
    """)
    with h5py.File(path, "r", swmr=True, locking=False) as f:
        header = h5py.h5o.get_info(f["sources/meter/values"].id).addr
    torn = bytearray(path.read_bytes())
    torn[header + 20] ^= 0xFF
    path.write_bytes(torn)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert "/sources/meter/values is damaged" in err and "checksum" in err
    assert main(["repair", str(path)]) == 2
    assert "checksum" in capsys.readouterr().err


@pytest.mark.fast
def test_a_file_being_recorded_is_never_repaired(tmp_path):
    path = str(tmp_path / "live.h5")
    writer = RunFileWriter(path, {}, 0)  # this very process is its writer: alive
    try:
        writer.flush()
        assert writer_status(path).alive is True
        assert not writer_status(path).needs_repair
        with pytest.raises(UsageError, match="being recorded now"):
            repair_run(path, force=True)
    finally:
        writer.close(fit_device_clocks=False)


@pytest.mark.system
def test_a_writer_that_cannot_be_checked_needs_force(tmp_path, capsys):
    path = tmp_path / "elsewhere.h5"
    crash_writer(path, """
        w._file.attrs["writer_json"] = '{"host": "another-host", "pid": 1}'
        w.flush()
    """)
    assert main(["repair", str(path)]) == 2
    assert "another-host" in capsys.readouterr().err
    assert main(["repair", "--force", str(path)]) == 0
    with h5py.File(path, "r") as f:
        assert json.loads(f.attrs[REPAIR_JSON])["writer"]["host"] == "another-host"


def assert_repaired_with_every_row(path: Path, rows: int, capsys) -> None:
    """Found unfinished, repaired: the record, the cut-off gap and every row written."""
    assert writer_status(str(path)).needs_repair
    assert main(["info", str(path)]) == 0
    assert "wattlab repair" in capsys.readouterr().out
    report = repair_run(str(path))
    assert report.repaired and report.gaps_added == ["meter"]
    assert not writer_status(str(path)).open
    with h5py.File(path, "r") as f:
        assert REPAIR_JSON in f.attrs and UNFINISHED not in f.attrs
        assert f["sources/meter/time"].shape[0] == rows
    with wattlab.open(str(path)) as run:
        assert [g.reason for g in run.gaps] == [CUT_OFF_REASON]


@pytest.mark.system
def test_a_writer_killed_between_two_closes_is_repaired(tmp_path, capsys):
    """A writer closes and reopens its file (a new stream, the final rewrite): a kill in
    between leaves superblock flags that say "closed", and only the unfinished mark tells."""
    path = tmp_path / "between.h5"
    crash_writer(path, """
        w.append("meter", *rows(0, 100))
        w.flush()
        w._file.close()
    """, flags_left=False)
    assert_repaired_with_every_row(path, 100, capsys)


@pytest.mark.system
def test_a_source_group_a_kill_left_unwhole_is_removed_with_a_gap_row(tmp_path, capsys):
    """A kill between creating a source's group and writing it leaves a link to nothing (or
    a group without its descriptor): repair removes it, says every row of it was lost, and
    keeps the other streams (seen once beside two CPU burners: repair raised
    AttributeError on the link to nothing)."""
    path = tmp_path / "unwhole.h5"
    crash_writer(path, """
        import h5py
        w.append("meter", *rows(0, 100))
        w.flush()
        w._file["sources"]["ghost"] = h5py.SoftLink("/never/written")
        w._file["sources"].create_group("bare")
        w._file.flush()
    """)
    assert main(["repair", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ghost: its group was not whole on disk" in out and "bare:" in out
    with wattlab.open(str(path)) as run:
        assert set(run.sources) == {"meter"}
        assert run.source("meter").time_ns.shape[0] == 100
        lost = {g.source: g.reason for g in run.gaps}
    assert set(lost) == {"meter", "ghost", "bare"}
    assert "every row of it lost" in lost["ghost"] and "every row of it lost" in lost["bare"]


@pytest.mark.system
def test_a_damaged_index_of_streams_is_a_clear_refusal_not_a_traceback(tmp_path, capsys):
    """A kill while /sources turns its index of streams into a heap (past eight streams) can
    leave the heap unreadable: HDF5 raises RuntimeError listing it (a fresh-clone CI's kill
    -9 trial; info crashed there). info and repair refuse it with exit 2, naming it."""
    path = tmp_path / "index.h5"
    crash_writer(path, """
        import dataclasses
        for i in range(11):
            w.add_source(dataclasses.replace(desc, source_id=f"m{i}"))
        w.flush()
    """)
    data = bytearray(path.read_bytes())
    for at in [i for i in range(len(data)) if data.startswith(b"FRHP", i)]:
        damaged = bytearray(data)
        damaged[at:at + 4] = b"XXXX"  # the heap's signature: HDF5 no longer reads it
        path.write_bytes(bytes(damaged))
        with open_read_only(str(path)) as f:
            try:
                list(f[SOURCES])
            except RuntimeError:
                break  # this heap is /sources' index
    else:
        pytest.fail("no heap of /sources found to damage")
    assert main(["info", str(path)]) == 2
    assert "/sources cannot be listed" in capsys.readouterr().err
    assert main(["repair", str(path)]) == 2
    assert "cannot resume" in capsys.readouterr().err


@pytest.mark.system
def test_a_repair_killed_after_clearing_the_flags_is_repaired_again(tmp_path, capsys):
    path = tmp_path / "twice.h5"
    crash_writer(path, """
        w.append("meter", *rows(0, 100))
        w.flush()
    """)
    clear_crash_flags(str(path))  # repair's first step: a kill here left "nothing to repair"
    assert_repaired_with_every_row(path, 100, capsys)


@pytest.mark.fast
def test_a_clean_file_is_left_as_it_is(tmp_path, capsys):
    path = tmp_path / "clean.h5"
    RunFileWriter(str(path), {}, 0).close(fit_device_clocks=False)
    before = path.read_bytes()
    assert main(["repair", str(path)]) == 0
    assert "closed cleanly; nothing to repair" in capsys.readouterr().out
    assert path.read_bytes() == before
    with h5py.File(path, "r") as f:
        assert json.loads(f.attrs[WRITER_JSON])["pid"] > 0
        assert UNFINISHED not in f.attrs
    assert main(["repair", str(tmp_path / "missing.h5")]) == 2


@pytest.mark.system
@pytest.mark.skipif(shutil.which("h5clear") is None,
                    reason="h5clear (Debian package hdf5-tools) is not installed")
def test_flags_are_cleared_exactly_as_h5clear_clears_them(tmp_path):
    path = tmp_path / "ours.h5"
    crash_writer(path, """
        w.append("meter", *rows(0, 10))
        w.flush()
        w.start_swmr()
    """)
    theirs = tmp_path / "theirs.h5"
    shutil.copy(path, theirs)
    assert clear_crash_flags(str(path)) is True
    subprocess.run(["h5clear", "-s", str(theirs)], check=True, capture_output=True)
    assert path.read_bytes() == theirs.read_bytes()


@pytest.mark.system
def test_a_killed_writer_not_yet_reaped_counts_as_gone():
    """A kill -9'd recorder whose parent died too stays a zombie until something reaps it;
    it holds no file and writes nothing, so repair must not wait for it."""
    import signal
    import time

    from wattlab.runfile.processes import writer_process

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = {**writer_process.writer_identity(), "pid": child.pid,
                    "start_ticks": writer_process._proc_start_ticks(child.pid)}
        assert writer_process.writer_alive(identity) is True
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while (Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
               != "Z") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer_process.writer_alive(identity) is False  # a zombie, not reaped
    finally:
        child.kill()
        child.wait()
    assert writer_process.writer_alive(identity) is False  # reaped: gone
