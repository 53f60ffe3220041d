"""A recording: the supervisor, source runners (threads or processes), remote agents, live view."""

from wattlab.acquisition.session.agent import (
    DEFAULT_CONNECT_TIMEOUT_S,
    WARN_AFTER_S,
    ClockSkew,
    HostAcquirer,
    run_agent,
)
from wattlab.acquisition.session.live import follow, live_panel, plain_table
from wattlab.acquisition.session.slurm_job import (
    SlurmTask,
    await_endpoint,
    free_port,
    job_summary,
    prepare,
    publish,
    rendezvous_dir,
)
from wattlab.acquisition.session.source_process import SourceSpec
from wattlab.acquisition.session.supervisor import STOP_TIMEOUT_S, Session, SessionResult

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "WARN_AFTER_S",
    "ClockSkew",
    "HostAcquirer",
    "Session",
    "SessionResult",
    "SlurmTask",
    "SourceSpec",
    "await_endpoint",
    "follow",
    "free_port",
    "job_summary",
    "live_panel",
    "plain_table",
    "prepare",
    "publish",
    "rendezvous_dir",
    "run_agent",
]
