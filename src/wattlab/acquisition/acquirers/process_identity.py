"""Who a GPU process is, from /proc: command, user, cgroup, container, pod, Slurm job.

Why pure functions over a proc root: NVML gives only pids; everything an operator charges
energy to (user, container, pod, job) is in /proc and the kubelet's pod log folders, and
tests build a fake /proc tree. Nothing is guessed: a field that cannot be read is None.

NVML gives pids of the host's pid namespace. wattlab in a container with its own /proc sees
other numbers: a pid is looked up only where this /proc numbers processes as the host does
(wattlab in the initial pid namespace, or a /proc of an outer namespace, which shows
wattlab itself in several: its ``NSpid`` has more than one field); elsewhere the process is
unknown (``local_pid`` and ``comm`` None).
"""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path
from typing import Any

PROC = Path("/proc")
PODS = Path("/var/log/pods")
INIT_PID_NS = "pid:[4026531836]"  # the kernel's initial pid namespace (PROC_PID_INIT_INO)
CGROUP_MAX = 512  # characters kept of a cgroup path; the marker payload stays under 2 kB
CMDLINE_MAX = 1024
IDENTITY_KEYS = ("start_ticks", "local_pid", "comm", "user", "cgroup", "container_id",
                 "pod_uid", "pod_name", "pod_namespace", "slurm_job", "slurm_step", "cmdline")

_CONTAINER = re.compile(
    r"(?:docker|cri-containerd|crio|libpod|containerd)[-/:]([0-9a-f]{64})(?:\.scope)?(?:/|$)"
    r"|/docker/([0-9a-f]{64})(?:/|$)")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_SLURM = re.compile(r"/job_(\d+)(?:/step_([^/]+))?")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:  # gone, or not ours to read
        return None


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut shown by a trailing "…"."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks after boot."""
    stat = _read(proc / str(pid) / "stat")
    if stat is None or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def _nspid(status: str | None) -> list[int]:
    for line in (status or "").splitlines():
        if line.startswith("NSpid:"):
            return [int(v) for v in line.split()[1:] if v.isdigit()]
    return []


def host_view(proc: Path = PROC) -> bool:
    """Whether this /proc numbers processes as the host (and NVML) does."""
    try:
        if os.readlink(proc / "self" / "ns" / "pid") == INIT_PID_NS:
            return True
    except OSError:
        pass
    return len(_nspid(_read(proc / "self" / "status"))) > 1


def local_pid(host_pid: int, proc: Path = PROC, *, host: bool | None = None) -> int | None:
    """The process's pid as wattlab sees it, None where it cannot be seen (see the module)."""
    if not (host_view(proc) if host is None else host):
        return None
    own = _nspid(_read(proc / "self" / "status"))
    theirs = _nspid(_read(proc / str(host_pid) / "status"))
    if not theirs:
        return host_pid if (proc / str(host_pid)).is_dir() else None
    depth = max(1, len(own))
    return theirs[depth - 1] if len(theirs) >= depth else None


def cgroup_v2(text: str | None) -> str | None:
    """The cgroup v2 path (the ``0::`` line of /proc/PID/cgroup)."""
    for line in (text or "").splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def container_id(cgroup: str | None) -> str | None:
    """The container's id from a docker, containerd, cri-o or podman cgroup scope."""
    m = _CONTAINER.search(cgroup or "")
    return None if m is None else m.group(1) or m.group(2)


def pod_uid(cgroup: str | None) -> str | None:
    """A Kubernetes pod's UID from its cgroup path (systemd's '_' turned back into '-')."""
    m = _POD.search(cgroup or "")
    return None if m is None else m.group(1).replace("_", "-")


def pod_name(uid: str | None, pods: Path = PODS) -> tuple[str | None, str | None]:
    """(namespace, name) from the kubelet's ``/var/log/pods/<ns>_<name>_<uid>`` folder."""
    if uid is None:
        return None, None
    try:
        folders = [p.name for p in pods.iterdir() if p.name.endswith("_" + uid)]
    except OSError:
        return None, None
    if len(folders) != 1:
        return None, None
    namespace, _, rest = folders[0].removesuffix("_" + uid).partition("_")
    return (namespace, rest) if rest else (None, None)


def slurm_ids(cgroup: str | None, environ: bytes | None) -> tuple[str | None, str | None]:
    """(job, step) from a Slurm cgroup path, else from SLURM_JOB_ID/SLURM_STEP_ID."""
    m = _SLURM.search(cgroup or "")
    if m is not None:
        return m.group(1), m.group(2)
    env = dict(item.partition(b"=")[::2] for item in (environ or b"").split(b"\0") if item)
    job, step = env.get(b"SLURM_JOB_ID"), env.get(b"SLURM_STEP_ID")
    return (job.decode(errors="replace") if job else None,
            step.decode(errors="replace") if step else None)


def cgroup_fields(cgroup: str | None, environ: bytes | None = None) -> dict[str, Any]:
    """What a cgroup path says: container, pod UID, Slurm job and step (environ: fallback)."""
    job, step = slurm_ids(cgroup, environ)
    return {"cgroup": None if cgroup is None else truncate(cgroup, CGROUP_MAX),
            "container_id": container_id(cgroup), "pod_uid": pod_uid(cgroup),
            "slurm_job": job, "slurm_step": step}


def user_name(status: str | None) -> str | None:
    """The real uid's user name (the uid itself where no name is known)."""
    for line in (status or "").splitlines():
        if line.startswith("Uid:") and len(line.split()) > 1:
            uid = int(line.split()[1])
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)
    return None


def _environ(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def identify(pid: int, *, proc: Path = PROC, pods: Path = PODS, cmdlines: bool = False,
             host: bool | None = None) -> dict[str, Any]:
    """Every identity field of a host pid (``IDENTITY_KEYS``), None where unknown.

    ``cmdlines``: read the command line (``record --process-cmdlines``); other users' are
    not shown otherwise.
    """
    out: dict[str, Any] = dict.fromkeys(IDENTITY_KEYS)
    local = local_pid(pid, proc, host=host)
    if local is None:
        return out
    here = proc / str(pid)  # a host-numbered /proc: the folder is the host pid's
    comm = _read(here / "comm")
    cgroup = cgroup_v2(_read(here / "cgroup"))
    from_env = not (cgroup and _SLURM.search(cgroup))
    out.update(cgroup_fields(cgroup, _environ(here / "environ") if from_env else None))
    out["pod_namespace"], out["pod_name"] = pod_name(out["pod_uid"], pods)
    cmdline = _read(here / "cmdline") if cmdlines else None
    out.update(start_ticks=start_ticks(pid, proc), local_pid=local,
               comm=None if comm is None else comm.strip(),
               user=user_name(_read(here / "status")),
               cmdline=None if not cmdline else truncate(cmdline.replace("\0", " ").strip(),
                                                         CMDLINE_MAX))
    return out
