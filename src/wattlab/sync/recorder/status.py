"""What the recorder tells about itself.

The ``status`` control's answer (also kept in the file as ``recorder_status_json``) and,
with ``--prometheus``, the exporter fed as rows are written.

Why apart from the router: the report reads every collaborator (streams, hosts' clocks,
sockets, writer) and changes none; gathering it here keeps the router to routing.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from wattlab.runfile import RunFileWriter
from wattlab.sync.recorder.config import RecorderConfig
from wattlab.sync.recorder.remote_clocks import RemoteClocks
from wattlab.sync.recorder.sockets import RecorderSockets
from wattlab.sync.recorder.source_state import SourceState
from wattlab.sync.recorder.stream_metrics import StreamMetrics

if TYPE_CHECKING:
    from wattlab.sync.recorder.prometheus import Exporter


def start_exporter(address: str) -> tuple[StreamMetrics | None, Exporter | None]:
    """The Prometheus endpoint: a thread fed with the rows as they are written."""
    if not address:
        return None, None
    from wattlab.sync.recorder.prometheus import Exporter

    metrics = StreamMetrics(processes=True)
    exporter = Exporter(address, metrics)
    print(f"wattlab recorder: Prometheus metrics at {exporter.url}", file=sys.stderr,
          flush=True)
    return metrics, exporter


def recorder_status(config: RecorderConfig, sources: dict[str, SourceState], *,
                    writer: RunFileWriter, clocks: RemoteClocks, sockets: RecorderSockets,
                    rejected: int, last_rejection: str,
                    refused: dict[str, int]) -> dict[str, Any]:
    """The answer to ``status``: each stream's counts, each host's clock, what was refused."""
    return {
        "sources": {
            sid: {
                "rows": s.rows,
                "batches": s.batches,
                "gaps": s.gaps,
                "samples_lost": s.samples_lost,
                "duplicates": s.duplicates,
                "ended": s.ended,
                "held": len(s.held),
                "flagged": dict(s.flagged),
            }
            for sid, s in sources.items()
        },
        "rejected": rejected,
        "last_rejection": last_rejection,
        "refused": refused,
        "swmr": writer.swmr,
        "hosts": clocks.hosts_status(sources),
        "refused_peers": sockets.refused_peers,
        "listen": sockets.listen_endpoint,
        "resumed": config.resume,
    }
