"""Which process writes a run file, and whether it still runs.

Why: a run file whose writer was killed and a run file being recorded right now look the
same on disk (the superblock says "open for writing" in both). Reading either is safe, but
repairing a live one would cut rows out from under its recorder. So the recorder stamps
the file with its host, boot, process id and process start time when it opens it, and
``wattlab info`` / ``wattlab repair`` ask whether that very process still exists (a pid
alone can be reused; the start time and boot id make the match exact on Linux).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from wattlab.runfile.schema import WRITER_JSON

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux ``/proc``), None if unknown."""
    fields = _proc_stat(pid)
    return None if fields is None else int(fields[19])  # field 22 of stat(5)


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def writer_identity() -> dict[str, Any]:
    """The calling process, as the run file records its writer."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "boot_id": _boot_id(),
            "start_ticks": _proc_start_ticks(pid)}


def writer_alive(identity: dict[str, Any]) -> bool | None:
    """True: that process runs; False: it is gone; None: cannot tell (another host)."""
    if identity.get("host") != socket.gethostname():
        return None
    if identity.get("boot_id") and identity["boot_id"] != _boot_id():
        return False  # the machine rebooted since
    pid = int(identity.get("pid", 0))
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    fields = _proc_stat(pid)
    if fields is not None and fields[0] in ("Z", "X"):
        return False  # killed, not yet reaped: it writes nothing any more
    started = identity.get("start_ticks")
    now = None if fields is None else int(fields[19])
    return started is None or now is None or now == started


def recorded_writer(attrs: Any) -> dict[str, Any]:
    """The writer stamped in a file's root attributes ({} for files from before the stamp)."""
    text = attrs.get(WRITER_JSON)
    if text is None:
        return {}
    try:
        found = json.loads(text.decode() if isinstance(text, bytes) else str(text))
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
