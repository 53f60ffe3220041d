"""The recorder process: receives every stream, writes the run file, reports and exports."""

from wattlab.sync.recorder.disk_full import (
    DISK_FULL_EXIT,
    RESERVE_BYTES,
    DiskFullReport,
    read_report,
    room_bytes,
)
from wattlab.sync.recorder.process import RecorderConfig, hosts_ready
from wattlab.sync.recorder.prometheus import Exporter, check_free, require_client
from wattlab.sync.recorder.stream_metrics import StreamMetrics

__all__ = [
    "DISK_FULL_EXIT",
    "RESERVE_BYTES",
    "DiskFullReport",
    "Exporter",
    "RecorderConfig",
    "StreamMetrics",
    "check_free",
    "hosts_ready",
    "read_report",
    "require_client",
    "room_bytes",
]
