"""Floods from one local client against a recorder with its default configuration.

    python bench/floods.py [--seconds 10]

Each scenario starts a recorder process (default settings), a legitimate publisher with
six streams (four NVML-like, two meter-like) sending throughout, and one flooding client
for ``--seconds``: batches of never-described streams (a new id each), new-stream
descriptors, markers, garbage, 100 MB frames, batches/gaps/ends forged into the
legitimate streams, and (on the remote bus, CurveZMQ) handshakes with a fresh key pair
each. It reports the recorder's peak memory (VmHWM), its stderr lines per
second, the legitimate rows kept / sent, and what was refused. Goals (issue 36): peak
memory <= 256 MB, at most one log line a second per kind of refusal, every legitimate row
kept. Prints the table, writes bench/results/floods.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from common import GOALS_MISSED, write_json
from wattlab.acquisition.markers import BUS_ENV
from wattlab.runfile import Run
from wattlab.samples import Channel, Gap, Marker, SampleBatch, SourceDescriptor
from wattlab.sync.bus import (
    BusPublisher,
    ControlClient,
    create_keypair,
    load_public_key,
    message,
)
from wattlab.sync.bus.publisher import local_endpoint
from wattlab.sync.recorder import RecorderConfig

LEGIT = ["gpu0.samples", "gpu0.power", "gpu0.energy", "gpu0.state", "meter0", "meter1"]
LEGIT_ROWS = 50  # per batch, every 20 ms per stream
MEMORY_GOAL_MB = 256.0
Flood = Callable[[zmq.Socket, int], None]  # (socket, i): send the i-th flood message


def _desc(source_id: str) -> SourceDescriptor:
    return SourceDescriptor(source_id, "bench", "flood", (Channel("power_w", "W"),))


def _batch(source_id: str, seq: int, rows: int = LEGIT_ROWS) -> SampleBatch:
    t = time.monotonic_ns() + np.arange(rows, dtype=np.int64) * 1000
    return SampleBatch(source_id, seq, t, np.full((rows, 1), 100.0))


def _orphans(sock: zmq.Socket, i: int) -> None:
    sock.send_multipart(message.encode_batch(_batch(f"ghost{i}", 0, 1000)), copy=False)


def _descriptors(sock: zmq.Socket, i: int) -> None:
    sock.send_multipart(message.encode_descriptor(_desc(f"new{i}")))


def _markers(sock: zmq.Socket, i: int) -> None:
    sock.send_multipart(message.encode_marker(Marker(time.monotonic_ns(), f"m{i}")))


def _garbage(sock: zmq.Socket, i: int) -> None:
    sock.send_multipart([b"t", b"not json %d" % i])


BIG = b"\0" * (100 * 1024 * 1024)


def _big_frames(sock: zmq.Socket, i: int) -> None:
    sock.send_multipart([b"t", BIG], copy=False)
    time.sleep(0.05)  # the frame is refused with its connection: let it reconnect


def forged_into(streams: list[str]) -> Flood:
    """A confused client: batches, gaps and ends for streams another client described."""
    def forge(sock: zmq.Socket, i: int) -> None:
        source = streams[i % len(streams)]
        kind = i % 3
        if kind == 0:
            sock.send_multipart(message.encode_batch(_batch(source, i)), copy=False)
        elif kind == 1:
            sock.send_multipart(message.encode_gap(Gap(source, "forged", i, i)))
        else:
            sock.send_multipart(message.encode_end(source, i))
    return forge


FLOODS: dict[str, Flood] = {
    "undescribed streams": _orphans, "new streams": _descriptors, "markers": _markers,
    "garbage": _garbage, "100 MB frames": _big_frames, "forged batch/gap/end": forged_into(LEGIT),
}


def _vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _legit(endpoint: str, stop: threading.Event, sent: dict[str, int]) -> None:
    pub = BusPublisher(endpoint, linger_ms=30_000)
    for source in LEGIT:
        pub.announce(_desc(source))
    pub.wait_ready(30)
    seq = 0
    while not stop.is_set():
        for source in LEGIT:
            pub.send_batch(_batch(source, seq))
            sent[source] = sent.get(source, 0) + LEGIT_ROWS
        seq += 1
        pub.flush()
        time.sleep(0.02)
    for source in LEGIT:
        pub.end(source, seq - 1)
    pub.close()


def send_flood(endpoint: str, flood: Flood, seconds: float) -> int:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 100)
    sock.setsockopt(zmq.IDENTITY, uuid.uuid4().hex.encode())
    sock.connect(endpoint)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        try:
            flood(sock, i)
        except zmq.Again:
            continue
        i += 1
    sock.close(0)
    return i


CURVE_FLOOD = "CURVE handshakes, fresh keys"


def curve_flood(listen: str, server_public: bytes, seconds: float) -> int:
    """A client retrying with a fresh key pair each time: every handshake is refused."""
    context = zmq.Context.instance()
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        public, secret = zmq.curve_keypair()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_serverkey = server_public
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.connect(listen)
        with contextlib.suppress(zmq.Again):
            sock.send(b"hello", zmq.NOBLOCK)
        time.sleep(0.001)  # long enough for the handshake to start
        sock.close(0)
        i += 1
    return i


def _listening(folder: str) -> tuple[dict[str, str], bytes]:
    """The recorder's remote-bus settings (its keys, an allow-list of one agent)."""
    keys = Path(folder) / "keys"
    allowed = keys / "allowed"
    allowed.mkdir(parents=True, exist_ok=True)
    public_path, secret_path = create_keypair(keys, "recorder")
    agent_public, _ = create_keypair(keys, "node1")
    agent_public.rename(allowed / agent_public.name)
    port = _free_port()
    return ({"listen": f"tcp://127.0.0.1:{port}", "server_key": str(secret_path),
             "allowed_keys": str(allowed)}, load_public_key(public_path))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_scenario(name: str, flood: Flood | None, seconds: float, folder: str
                 ) -> dict[str, Any]:
    """One flood (``None``: the CURVE handshake flood on the remote bus)."""
    path = f"{folder}/{name.replace(' ', '_').replace('/', '_').replace(',', '')}.h5"
    endpoint = local_endpoint()
    err_path = f"{path}.stderr"
    remote, server_public = _listening(folder) if flood is None else ({}, b"")
    cfg = RecorderConfig(endpoint=endpoint, output=path, session_start_ns=0, **remote)
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "wattlab.sync.recorder", cfg.to_json()],
                                stderr=err)
    stop = threading.Event()
    sent: dict[str, int] = {}
    legit = threading.Thread(target=_legit, args=(endpoint, stop, sent))
    legit.start()
    time.sleep(1.0)  # the legitimate streams are described and flowing
    started = time.monotonic()
    messages = (curve_flood(remote["listen"], server_public, seconds) if flood is None
                else send_flood(endpoint, flood, seconds))
    flood_s = time.monotonic() - started
    stop.set()
    legit.join(60)
    peak_mb = _vm_hwm_mb(proc.pid)
    control = ControlClient(endpoint)
    try:
        final = control.request("stop", timeout_s=120)
    finally:
        control.close()
    proc.wait(60)
    lines = Path(err_path).read_text(errors="replace").splitlines()
    with Run(path) as run:
        kept = sum(len(run.source(s)) for s in LEGIT)
        gap_rows = len(run.gaps)
        markers = len(run.markers)
    return {
        "flood": name, "messages": messages, "flood_s": flood_s, "peak_rss_mb": peak_mb,
        "log_lines": len(lines), "log_lines_per_s": len(lines) / flood_s,
        "log_kinds": len(final.get("refused", {})) or 1,
        "rows_sent": sum(sent.values()), "rows_kept": kept, "gap_rows": gap_rows,
        "markers_written": markers, "refused": final.get("refused", {}),
        "streams": len(final["sources"]), "exit": proc.returncode,
        "log_tail": lines[-3:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--only", action="append", choices=[*FLOODS, CURVE_FLOOD],
                        help="run only this flood (repeatable)")
    parser.add_argument("--forge-as-workload", type=float, metavar="SECONDS",
                        help="run as a session's workload instead: forge batch/gap/end into "
                             "its gpu0 streams (bus address from $WATTLAB_BUS), 100 a second")
    args = parser.parse_args()
    if args.forge_as_workload is not None:
        forge = forged_into(LEGIT[:4])
        paced: Flood = lambda sock, i: (forge(sock, i), time.sleep(0.01))  # noqa: E731
        send_flood(os.environ[BUS_ENV], paced, args.forge_as_workload)
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="wattlab-floods-") as folder:
        floods: dict[str, Flood | None] = {**FLOODS, CURVE_FLOOD: None}
        for name, flood in floods.items():
            if args.only and name not in args.only:
                continue
            results.append(run_scenario(name, flood, args.seconds, folder))
            print(f"  {name}: done", file=sys.stderr, flush=True)
    print(f"{'flood':<22} {'messages':>9} {'peak MB':>8} {'log/s':>6} {'rows kept/sent':>16} "
          f"{'gap rows':>8} {'markers':>8} {'streams':>7}")
    missed = False
    for r in results:
        print(f"{r['flood']:<22} {r['messages']:>9} {r['peak_rss_mb']:>8.0f} "
              f"{r['log_lines_per_s']:>6.1f} {r['rows_kept']:>7}/{r['rows_sent']:<8} "
              f"{r['gap_rows']:>8} {r['markers_written']:>8} {r['streams']:>7}")
        missed |= (r["peak_rss_mb"] > MEMORY_GOAL_MB or r["rows_kept"] != r["rows_sent"]
                   or r["log_lines_per_s"] > r["log_kinds"] + 1)
    out = write_json("floods", {"seconds": args.seconds, "memory_goal_mb": MEMORY_GOAL_MB,
                                "results": results})
    print(f"wrote {out}")
    return GOALS_MISSED if missed else 0


if __name__ == "__main__":
    sys.exit(main())
