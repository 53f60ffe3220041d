"""Fault injection: every fault the recorder and the sessions are built to survive, measured.

    python bench/faults.py

Each scenario runs real processes and sockets (recorder subprocesses, `wattlab record`
sessions with source processes, kill -9, a slow disk, hostile peers, broken files) and
reports: samples lost, whether the loss is in /gaps (never silent), whether the session
survived. Prints the table (for BENCHMARKS.md and docs/reliability.md), adds the soak
figures from bench/results/soak.json when present, writes bench/results/faults.json.

The "rows" scenarios (`--only rows:`) run a whole session in this process (the Python
API, so its result holds the rows each source sent per stream) with two simulated GPUs in
source processes, inject each fault of docs/reliability.md's table into the real recorder
or source process (or as the workload), and give a second table: rows kept / rows sent,
the gap rows, the rows those gap rows account for, and the exit status `wattlab record`
would return (docs/reliability.md, "Rows kept against rows sent").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from common import RESULTS, write_json
from wattlab.acquisition.session import Session, SessionResult, SourceSpec
from wattlab.commands.record import exit_status
from wattlab.runfile import Run
from wattlab.samples import Channel, SampleBatch, SourceDescriptor
from wattlab.sync.bus import BusPublisher, ControlClient
from wattlab.sync.bus.publisher import local_endpoint
from wattlab.sync.recorder import RecorderConfig

ROWS = 200
REFUSED_FORGED = "does not own the stream"  # the recorder's reason for a forger's batches


def _batch(seq: int) -> SampleBatch:
    index = np.arange(seq * ROWS, (seq + 1) * ROWS, dtype=np.float64)
    t = time.monotonic_ns() + np.arange(ROWS, dtype=np.int64) * 25_000
    return SampleBatch("meter", seq, t, index[:, None])


def _recorder(path: str, endpoint: str, **config: Any) -> subprocess.Popen[bytes]:
    cfg = RecorderConfig(endpoint=endpoint, output=path, session_start_ns=0,
                         **{"flush_interval_s": 0.5, **config})
    return subprocess.Popen([sys.executable, "-m", "wattlab.sync.recorder", cfg.to_json()],
                            stderr=subprocess.DEVNULL)


def _send(pub: BusPublisher, seq: int, seconds: float) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pub.send_batch(_batch(seq))
        pub.flush()
        seq += 1
        time.sleep(0.005)
    return seq


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _stop(endpoint: str, recorder: subprocess.Popen[bytes]) -> None:
    control = ControlClient(endpoint)
    control.request("stop", timeout_s=60)
    control.close()
    recorder.wait(60)


def _file_rows(path: str) -> tuple[int, list[Any]]:
    with Run(path) as run:
        return len(run.source("meter")), run.gaps


def recorder_kill(folder: str, restart: str) -> dict[str, Any]:
    """kill -9 of the recorder at 40 k rows/s; no restart, a restart, or a long outage."""
    path = str(Path(folder) / f"recorder_{restart}.h5")
    endpoint = local_endpoint()
    recorder = _recorder(path, endpoint)
    row_bytes = ROWS * 16 + 200
    window = 150 * row_bytes if restart == "outage" else 64 << 20  # 0.75 s of data
    pub = BusPublisher(endpoint, linger_ms=0 if restart == "none" else 20_000,
                       window_bytes=window, backlog_bytes=50 * row_bytes)
    desc = SourceDescriptor("meter", "bench", "Fault", (Channel("index", "1"),))
    pub.announce(desc)
    pub.wait_ready(30)
    seq = _send(pub, 0, 1.5)
    t_kill = time.monotonic_ns()
    _kill(recorder)
    if restart == "none":
        sent = seq * ROWS
        pub.close()
        with Run(path) as run:
            rows = len(run.source("meter"))
            lost_s = (t_kill - int(run.source("meter").time_ns[-1])) / 1e9
        return {"samples_lost": sent - rows, "lost_s": round(lost_s, 3),
                "in_gaps": "n/a (no recorder)", "survived": "file readable",
                "note": f"last {lost_s:.2f} s before the kill not in the file"}
    seq = _send(pub, seq, 2.0 if restart == "outage" else 0.3)
    recorder = _recorder(path, endpoint, resume=True)
    seq = _send(pub, seq, 1.0)
    pub.end("meter", seq - 1)
    pub.close()
    _stop(endpoint, recorder)
    rows, gaps = _file_rows(path)
    lost = seq * ROWS - rows
    in_gaps = sum(g.samples_lost for g in gaps)
    return {"samples_lost": lost, "in_gaps": in_gaps, "survived": "yes",
            "note": f"{pub.resent_batches} batches resent, {len(gaps)} gap row(s)"}


def _record(path: Path, *extra: str, seconds: float = 4.0) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "wattlab.cli", "record", "--simulate", "--simulated-gpus", "2",
            "--duration", str(seconds), "-o", str(path), *extra]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _child(session_pid: int, needle: str) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
            if ppid == session_pid and needle in cmd:
                return int(entry.name)
        time.sleep(0.05)
    raise RuntimeError(f"no child {needle!r}")


def _wait_for_rows(path: Path) -> None:
    """Until the live file has NVML rows: the workload is running (supervision is on)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with Run(str(path)) as run:
                if "gpu1.power" in run.sources and len(run.source("gpu1.power")):
                    return
        except Exception:  # not there yet, or between two writes
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{path}: no data")


def session_kill(folder: str, victim: str, *extra: str) -> dict[str, Any]:
    """kill -9 of a source process or the recorder inside a `wattlab record` session."""
    path = Path(folder) / f"session_{victim}_{len(extra)}.h5"
    # 10 s: the file turns SWMR-readable 5 s in, and the kill must land mid-run
    session = _record(path, "--source-processes", *extra, seconds=10.0)
    needle = "wattlab.sync.recorder" if victim == "recorder" else '"name": "gpu0"'
    pid = _child(session.pid, needle)
    _wait_for_rows(path)
    time.sleep(1.0)
    if session.poll() is not None:  # a kill after the end would prove nothing
        raise RuntimeError(f"session ended (exit {session.returncode}) before the kill")
    os.kill(pid, signal.SIGKILL)
    session.communicate(timeout=120)
    with Run(str(path)) as run:
        gaps = [g for g in run.gaps if g.source == "gpu0.power"]
        t = run.source("gpu0.power").time_ns
        other = run.source("gpu1.power").time_ns
        gap_s = 0.0 if not gaps else ((gaps[0].time_last_ns or 0) - (gaps[0].time_first_ns or 0))
        worst_s = float(np.max(np.diff(t))) / 1e9
        poll_s = run.source("gpu0.power").descriptor["config"]["intervals_s"]["power"]
        all_gaps = len(run.gaps)
    survived = f"yes (exit {session.returncode}, gpu1 {float(other[-1] - other[0]) / 1e9:.1f} s)"
    if victim == "recorder":
        return {"samples_lost": 0 if not all_gaps and worst_s < 2 * poll_s + 0.05 else "see gaps",
                "in_gaps": all_gaps, "survived": survived,
                "note": f"longest step in gpu0.power {worst_s * 1000:.0f} ms "
                        f"(polled every {poll_s * 1000:g} ms)"}
    lost = sum(g.samples_lost for g in gaps)
    return {"samples_lost": f"{gap_s / 1e9:.2f} s of gpu0.power"
                            + (f" ({lost} rows)" if lost >= 0 else " (rows unknown)"),
            "in_gaps": f"yes ({len(gaps)} row)" if gaps else "NO",
            "survived": survived, "note": "restarted, numbering on" if extra else
            "gpu0 stopped, gpu1 went on"}


class FailingAcquirer:
    """A simulated GPU whose driver raises ``after_s`` after opening (an unplugged card)."""

    def __init__(self, inner: Any, after_s: float) -> None:
        self._inner = inner
        self._after_s = after_s
        self._fail_at = float("inf")

    def open(self) -> list[SourceDescriptor]:
        self._fail_at = time.monotonic() + self._after_s
        descriptors: list[SourceDescriptor] = self._inner.open()
        return descriptors

    def poll(self) -> list[Any]:
        if time.monotonic() >= self._fail_at:
            raise RuntimeError("simulated driver error: GPU has fallen off the bus")
        readings: list[Any] = self._inner.poll()
        return readings

    def __getattr__(self, name: str) -> Any:  # close, flush, wake: the simulated GPU's own
        return getattr(self._inner, name)


Inject = Callable[[Session, int, Path], None]  # (session, recorder pid, run file)


def _signal(sig: signal.Signals) -> Inject:
    return lambda session, recorder, path: os.kill(recorder, sig)


def _stall(seconds: float) -> Inject:
    """SIGSTOP the recorder for a while, then let it go on (it is away, not dead)."""
    def inject(session: Session, recorder: int, path: Path) -> None:
        os.kill(recorder, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(recorder, signal.SIGCONT)
    return inject


def _kill_source(session: Session, recorder: int, path: Path) -> None:
    os.kill(_child(os.getpid(), '"name": "gpu0"'), signal.SIGKILL)


def _interrupt(session: Session, recorder: int, path: Path) -> None:
    session.request_stop()  # what Ctrl-C and SIGTERM call


def _file_size_limit(session: Session, recorder: int, path: Path) -> None:
    """``ulimit -f`` on the running recorder at the size its file has now (EFBIG next)."""
    import resource

    limit = path.stat().st_size
    resource.prlimit(recorder, resource.RLIMIT_FSIZE, (limit, limit))


def _nothing(session: Session, recorder: int, path: Path) -> None:
    pass


def _gpu_specs(count: int) -> list[SourceSpec]:
    return [SourceSpec(f"gpu{i}", "nvml", gpu_index=i, simulate=True, simulated_gpus=2)
            for i in range(count)]


def _failing_gpu1() -> tuple[list[SourceSpec], list[tuple[str, Any]]]:
    acquirer, _ = SourceSpec("gpu1", "nvml", gpu_index=1, simulate=True, simulated_gpus=2).build()
    return _gpu_specs(1), [("gpu1", FailingAcquirer(acquirer, after_s=3.0))]


def session_rows(folder: str, fault: str, inject: Inject = _nothing, *,
                 sources: Callable[[], tuple[list[SourceSpec], list[tuple[str, Any]]]]
                 = lambda: (_gpu_specs(2), []),
                 command: list[str] | None = None, **options: Any) -> dict[str, Any]:
    """A session in this process with two simulated GPUs, a fault injected mid-run.

    Rows kept (in the file, after the session's own repair where it made one) against the
    rows the sources sent (``SessionResult.rows_sent``), the gap rows and the rows they
    account for (-1: a gap whose row count nobody knows), the exit status of `record`.
    """
    path = Path(folder) / f"rows_{fault.replace(' ', '_')}.h5"
    specs, acquirers = sources()
    session = Session(str(path), acquirers, command=command, source_specs=specs,
                      duration_s=10.0, stop_timeout_s=2.0, **options)
    box: dict[str, SessionResult] = {}
    runner = threading.Thread(target=lambda: box.update(result=session.run()))
    started = time.monotonic()
    runner.start()
    recorder = _child(os.getpid(), "wattlab.sync.recorder")
    try:
        _wait_for_rows(path)
        time.sleep(1.0)
        inject(session, recorder, path)
        runner.join(180)
    finally:
        with contextlib.suppress(ProcessLookupError):  # never leave a stopped recorder
            os.kill(recorder, signal.SIGCONT)
    result = box["result"]
    with Run(str(path)) as run:
        kept = {sid: len(run.source(sid)) for sid in run.sources}
        gaps = run.gaps
    return rows_outcome(result, kept, gaps, time.monotonic() - started)


def rows_outcome(result: SessionResult, kept: dict[str, int], gaps: list[Any],
                 seconds: float) -> dict[str, Any]:
    """The figures of one session: kept / sent, what the gap rows account for, exit status."""
    # a source process killed before its report: its rows sent are unknown (a restarted
    # one reported only the rows of its last process)
    restarted = {name for name, n in result.source_restarts.items() if n}
    unknown = sorted(sid for sid in kept if sid not in result.rows_sent
                     or sid.split(".")[0] in restarted)
    sent = sum(n for sid, n in result.rows_sent.items() if sid not in unknown)
    kept_counted = sum(n for sid, n in kept.items() if sid not in unknown)
    refused = [g for g in gaps if REFUSED_FORGED in g.reason]  # rows no source of ours sent
    ours = [g for g in gaps if REFUSED_FORGED not in g.reason]
    in_gaps = sum(g.samples_lost for g in ours if g.samples_lost > 0)
    uncounted = sum(1 for g in ours if g.samples_lost < 0)
    sources = sorted({sid.split(".")[0] for sid in unknown})
    return {"samples_lost": sent - kept_counted, "in_gaps": in_gaps,
            "survived": f"yes (exit {exit_status(result)})",
            "note": (result.salvage.line().removeprefix("wattlab: ").split(";")[0]
                     if result.salvage else f"{result.recorder_restarts} recorder restart(s)"),
            "rows": f"{kept_counted} / {sent}"
                    + (f" (+{sum(kept[s] for s in unknown)} kept of {', '.join(sources)}: "
                       "sent unknown, -1)" if unknown else ""),
            "gap_rows": len(gaps),
            "gap_note": f"{in_gaps}" + (f" (+{uncounted} gap row(s) of unknown size, -1)"
                                        if uncounted else "")
                        + (f" (+{sum(g.samples_lost for g in refused)} forged rows refused, "
                           f"{len(refused)} gap row(s))" if refused else ""),
            "exit": exit_status(result), "seconds": round(seconds, 1),
            "sent": sent, "kept": kept_counted, "unknown": unknown, "uncounted_gaps": uncounted}


def duplicates(folder: str) -> dict[str, Any]:
    """The stream's own client sends batches whose sequence numbers were already taken.

    No session can be made to do this (its runners number their batches), so a recorder
    alone: rows sent are what this publisher sent, and there is no exit status.
    """
    path = str(Path(folder) / "duplicates.h5")
    endpoint = local_endpoint()
    started = time.monotonic()
    recorder = _recorder(path, endpoint)
    pub = BusPublisher(endpoint, linger_ms=20_000)
    pub.announce(SourceDescriptor("meter", "bench", "Fault", (Channel("index", "1"),)))
    pub.wait_ready(30)
    seq = _send(pub, 0, 0.5)
    taken = [1, 2, 3]
    for again in taken:
        pub.send_batch(_batch(again))
        pub.flush()
    seq = _send(pub, seq, 0.5)
    pub.end("meter", seq - 1)
    pub.close()
    _stop(endpoint, recorder)
    rows, gaps = _file_rows(path)
    sent = (seq + len(taken)) * ROWS
    in_gaps = sum(g.samples_lost for g in gaps if g.samples_lost > 0)
    return {"samples_lost": sent - rows, "in_gaps": in_gaps, "survived": "yes",
            "note": "; ".join(sorted({g.reason for g in gaps})), "rows": f"{rows} / {sent}",
            "gap_rows": len(gaps), "gap_note": str(in_gaps), "sent": sent, "kept": rows,
            "unknown": [], "uncounted_gaps": 0,
            "exit": "- (a recorder alone)", "seconds": round(time.monotonic() - started, 1)}


def whole_session_kill(folder: str) -> dict[str, Any]:
    """kill -9 of the whole process group: nothing is left to count (stated, not run)."""
    return {"samples_lost": "-", "in_gaps": "-", "survived": "no process survives",
            "note": "no process survives to count", "rows": "unknown (-1): no process survives "
            "to count", "gap_rows": "after `wattlab repair`: one per stream not ended",
            "gap_note": "-1 (`recording cut off`)", "exit": "- (killed)", "seconds": "-"}


FLOODS_PY = str(Path(__file__).with_name("floods.py"))
SMALL_QUEUES = {"window_bytes": 2 << 10, "backlog_bytes": 2 << 10}

FLOOD = r"""
import json, sys, time
import numpy as np
from wattlab.samples import Channel, SampleBatch, SourceDescriptor
from wattlab.sync.bus import BusPublisher
desc = SourceDescriptor("flood", "bench", "Flood", tuple(Channel(f"c{i}", "W") for i in range(8)),
                        value_dtype="<f4")
pub = BusPublisher(sys.argv[1], linger_ms=30000, window_bytes=4 << 20, backlog_bytes=4 << 20)
pub.announce(desc); pub.wait_ready(30)
seq, t0 = 0, time.monotonic()
while time.monotonic() - t0 < float(sys.argv[2]):
    pub.send_batch(SampleBatch("flood", seq, time.monotonic_ns() + np.arange(2000),
                               np.full((2000, 8), seq, dtype="<f4")))
    seq += 1
pub.end("flood", seq - 1); pub.close()
print(json.dumps({"rows": seq * 2000, "dropped": pub.dropped_rows}))
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def slow_disk(folder: str) -> dict[str, Any]:
    """A publisher flooding as fast as Python can into a recorder whose writes sleep 0.1 s."""
    path = str(Path(folder) / "flood.h5")
    endpoint = local_endpoint()
    recorder = _recorder(path, endpoint, flush_interval_s=0.2, test_write_delay_s=0.1)
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, endpoint, "5"], stdout=subprocess.PIPE)
    rss: list[tuple[float, float]] = []
    while flood.poll() is None:
        try:
            rss.append((_rss_mb(flood.pid), _rss_mb(recorder.pid)))
        except OSError:
            break
        time.sleep(0.1)
    out, _ = flood.communicate()
    sent = json.loads(out.decode().strip().splitlines()[-1])
    _stop(endpoint, recorder)
    with Run(path) as run:
        rows = len(run.source("flood"))
        in_gaps = sum(g.samples_lost for g in run.gaps)
    warm = rss[len(rss) // 4:]
    growth = max(r[0] + r[1] for r in warm) - (warm[0][0] + warm[0][1])
    return {"samples_lost": sent["rows"] - rows, "in_gaps": in_gaps, "survived": "yes",
            "note": f"{100 * (sent['rows'] - rows) / sent['rows']:.1f} % of an impossible "
                    f"flood dropped; RSS growth after warm-up {growth:.0f} MB"}


def hostile_peer(folder: str) -> dict[str, Any]:
    """1000 random multipart messages into the recorder's socket, then a real source."""
    import zmq

    path = str(Path(folder) / "hostile.h5")
    endpoint = local_endpoint()
    recorder = _recorder(path, endpoint)
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(endpoint)
    rng = np.random.default_rng(3)
    for _ in range(1000):
        sock.send_multipart([rng.bytes(int(rng.integers(0, 200)))
                             for _ in range(int(rng.integers(1, 5)))])
    sock.close()
    pub = BusPublisher(endpoint)
    pub.announce(SourceDescriptor("meter", "bench", "Fault", (Channel("index", "1"),)))
    pub.wait_ready(30)
    seq = _send(pub, 0, 0.5)
    pub.end("meter", seq - 1)
    pub.close()
    control = ControlClient(endpoint)
    reply = control.request("stop", timeout_s=60)
    control.close()
    recorder.wait(60)
    rows, gaps = _file_rows(path)
    return {"samples_lost": seq * ROWS - rows, "in_gaps": len(gaps), "survived": "yes",
            "note": f"{reply['rejected']} messages rejected and counted"}


def bad_files(folder: str) -> dict[str, Any]:
    """Analysis commands on corrupt files: each must exit 2 with one line."""
    import h5py

    paths = {"random": Path(folder) / "random.h5", "empty": Path(folder) / "empty.h5",
             "other": Path(folder) / "other.h5"}
    paths["random"].write_bytes(np.random.default_rng(1).bytes(4096))
    paths["empty"].write_bytes(b"")
    with h5py.File(paths["other"], "w") as f:
        f["x"] = np.arange(3)
    codes = []
    for p in paths.values():
        for verb in ("info", "energy"):
            done = subprocess.run([sys.executable, "-m", "wattlab.cli", verb, str(p)],
                                  capture_output=True, text=True, check=False)
            codes.append(done.returncode == 2 and "Traceback" not in done.stderr)
    return {"samples_lost": "-", "in_gaps": "-", "survived": f"{sum(codes)}/{len(codes)} exit 2",
            "note": "random bytes, empty, other layout (more in tests/test_faults_files.py)"}


SCENARIOS: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
    ("recorder kill -9, not restarted", lambda d: recorder_kill(d, "none")),
    ("recorder kill -9, restarted 0.3 s later", lambda d: recorder_kill(d, "restart")),
    ("recorder away 2 s, replay window 0.75 s", lambda d: recorder_kill(d, "outage")),
    ("session: recorder kill -9", lambda d: session_kill(d, "recorder")),
    ("session: source process kill -9", lambda d: session_kill(d, "gpu0")),
    ("session: source kill -9, --restart-sources",
     lambda d: session_kill(d, "gpu0", "--restart-sources")),
    ("flood into a disk 10x too slow", slow_disk),
    ("1000 random messages on the bus", hostile_peer),
    ("corrupt / foreign run files", bad_files),
    ("rows: clean session", lambda d: session_rows(d, "clean")),
    ("rows: recorder kill -9, restarted",
     lambda d: session_rows(d, "kill", _signal(signal.SIGKILL))),
    ("rows: recorder kill -9, --no-restart-recorder",
     lambda d: session_rows(d, "kill no restart", _signal(signal.SIGKILL), restart_recorder=False)),
    ("rows: recorder stalled (SIGSTOP), --stop-timeout 2",
     lambda d: session_rows(d, "stall", _signal(signal.SIGSTOP))),
    ("rows: recorder away 6 s (SIGSTOP), replay window + backlog 2 + 2 KiB",
     lambda d: session_rows(d, "away", _stall(6.0), **SMALL_QUEUES)),
    ("rows: disk slower than the data (0.3 s a write), window + backlog 2 + 2 KiB",
     lambda d: session_rows(d, "slow disk", recorder_options={"test_write_delay_s": 0.3},
                            **SMALL_QUEUES)),
    ("rows: source process kill -9", lambda d: session_rows(d, "source kill", _kill_source)),
    ("rows: source process kill -9, --restart-sources",
     lambda d: session_rows(d, "source kill restart", _kill_source, restart_sources=True)),
    ("rows: source fails (driver error 3 s in)",
     lambda d: session_rows(d, "source fails", sources=_failing_gpu1)),
    ("rows: the workload forges batch/gap/end into gpu0's streams",
     lambda d: session_rows(d, "forged", command=[sys.executable, FLOODS_PY,
                                                  "--forge-as-workload", "5"])),
    ("rows: duplicate sequence numbers from the stream's own client", duplicates),
    ("rows: Ctrl-C / SIGTERM", lambda d: session_rows(d, "interrupt", _interrupt)),
    ("rows: disk full (ulimit -f on the recorder)",
     lambda d: session_rows(d, "disk full", _file_size_limit)),
    ("rows: whole session kill -9", whole_session_kill),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="run the scenarios whose name has this")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="wattlab-faults-") as folder:
        for name, scenario in SCENARIOS:
            if args.only not in name:
                continue
            try:
                outcome = scenario(folder)
            except Exception as e:  # a scenario that breaks is a result too
                outcome = {"samples_lost": "?", "in_gaps": "?", "survived": "NO",
                           "note": f"{type(e).__name__}: {e}"[:120]}
            rows.append({"fault": name, **outcome})
            print(f"  done: {name}", file=sys.stderr)
    header = "| fault | samples lost | in /gaps | session / file | notes |"
    lines = [header, "|---|---|---|---|---|"]
    lines += [f"| {r['fault']} | {r['samples_lost']} | {r['in_gaps']} | {r['survived']} | "
              f"{r['note']} |" for r in rows]
    soak_path = RESULTS / "soak.json"
    soak = json.loads(soak_path.read_text()) if soak_path.exists() else None
    if soak is not None:
        procs = ", ".join(f"{k} {v['rss_start_mb']:.0f}->{v['rss_end_mb']:.0f} MB "
                          f"{v['cpu_pct_of_core']:.1f} %" for k, v in
                          sorted(soak["processes"].items()))
        lines.append(f"| soak {soak['seconds']:g} s (PS3 20 kHz + WT310E + NVML) | "
                     f"{soak['ps3_lost']} of {soak['ps3_frames_sent']} PS3 frames | "
                     f"{len(soak['gaps'])} gaps | exit {soak['exit_status']} | RSS start->end, "
                     f"CPU % of a core: {procs} |")
    counted = [r for r in rows if "rows" in r]
    rows_table = ["| fault | rows kept / rows sent | gap rows | rows in gap rows | exit status "
                  "| session s |", "|---|---|---|---|---|---|"]
    rows_table += [f"| {r['fault'].removeprefix('rows: ')} | {r['rows']} | {r['gap_rows']} | "
                   f"{r['gap_note']} | {r['exit']} | {r['seconds']} |" for r in counted]
    print("\n".join(lines))
    if counted:
        print("\n" + "\n".join(rows_table))
    write_json("faults", {"benchmark": "faults", "scenarios": rows, "table": lines,
                          "rows_table": rows_table if counted else []})
    return 0 if all(r["survived"] != "NO" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
