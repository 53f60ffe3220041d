"""One recording per node under torchrun, torch.distributed or MPI, never one per rank.

Why: a launcher starts the same command once per rank, so ``wattlab record`` in that
command would record every GPU of the node once per rank, and the job's energy would come
out N times too large. ``wattlab record --per-node`` asks here whether this process is the
node's recorder: the local rank the launcher set (``LOCAL_RANK`` from torchrun, Open MPI's,
MPICH's, Slurm's) must be 0, and a node-local lock file must be free (two launchers of one
job on one node, or a launcher that sets no local rank, still give one recorder). Every
other rank runs the command without recording.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from wattlab.errors import UsageError

LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                   "SLURM_LOCALID")
NODE_RANK_VARS = ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK")
JOB_ID_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "OMPI_MCA_ess_base_jobid")


def _first(names: tuple[str, ...]) -> tuple[str, str] | None:
    return next(((n, os.environ[n]) for n in names if os.environ.get(n, "") != ""), None)


def local_rank() -> tuple[str, int] | None:
    """(variable, local rank) from the launcher, or None when no launcher set one."""
    found = _first(LOCAL_RANK_VARS)
    if found is None:
        return None
    try:
        return found[0], int(found[1])
    except ValueError as e:
        raise UsageError(f"{found[0]}={found[1]!r} is not a whole number") from e


def node_rank() -> str:
    """The node's number in the job ("0" where the launcher says nothing)."""
    found = _first(NODE_RANK_VARS)
    return "0" if found is None else found[1]


def job_id() -> str:
    """The launcher's id of this job, so two jobs on one node each get their recorder."""
    found = _first(JOB_ID_VARS)
    text = "default" if found is None else found[1]
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:64]


@dataclass(frozen=True)
class Election:
    """Whether this process records the node, and the one line that says why."""

    records: bool
    why: str


@contextmanager
def node_recorder(lock_dir: str | None = None) -> Iterator[Election]:
    """Elect this process as the node's recorder or not; the lock is held until the exit."""
    rank = local_rank()
    if rank is not None and rank[1] != 0:
        yield Election(False, f"{rank[0]}={rank[1]}: local rank 0 records this node")
        return
    path = Path(lock_dir or tempfile.gettempdir()) / f"wattlab-{os.getuid()}-{job_id()}.lock"
    with path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield Election(False, f"{path} is held: another process records this node")
            return
        try:
            said = f"{rank[0]}=0" if rank is not None else "no local rank set"
            yield Election(True, f"{said}, lock {path}: this process records node "
                                 f"{node_rank()}")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
