"""The processes of a recording, as a run file keeps them: who writes it, what they cost."""

from wattlab.runfile.processes.recording_cpu import (
    ProcessCpu,
    RecordingCpu,
    show_recording_cpu,
    stop_attrs,
)
from wattlab.runfile.processes.writer_process import recorded_writer, writer_alive, writer_identity

__all__ = ["ProcessCpu", "RecordingCpu", "recorded_writer", "show_recording_cpu", "stop_attrs",
           "writer_alive", "writer_identity"]
