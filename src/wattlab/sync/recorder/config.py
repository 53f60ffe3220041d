"""The recorder's settings.

Why a module of its own: the session builds them and hands them to the recorder process as
JSON on its command line, and the recorder's collaborators read them; none of these needs
the process module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RecorderConfig:
    """Everything the recorder process needs; passed as JSON on its command line."""

    endpoint: str
    output: str
    session_start_ns: int
    root_attrs: dict[str, Any] = field(default_factory=dict)
    expected_sources: list[str] = field(default_factory=list)
    flush_interval_s: float = 0.5
    drain_timeout_s: float = 5.0
    swmr_after_s: float = 5.0
    listen: str = ""  # tcp endpoint for remote agents (CURVE only); "" = local only
    server_key: str = ""  # this recorder's NAME.key_secret
    allowed_keys: str = ""  # folder of agents' NAME.key files
    expected_hosts: list[str] = field(default_factory=list)
    clock_interval_s: float = 0.1
    clock_window_s: float = 1.0
    resume: bool = False  # reopen ``output`` after a crashed recorder (see docs/reliability.md)
    test_write_delay_s: float = 0.0  # fault injection: a disk this much slower per write
    parent_pid: int = 0  # the session: when it is gone, drain and close the file (0: never)
    prometheus: str = ""  # HOST:PORT: serve the streams' figures to Prometheus ("" = no)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)
