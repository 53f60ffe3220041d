"""The run-file layout, declared once: every group, dataset, table, field and attribute.

Why one declaration: the writer, the reader, the layout check, repair and the analysis
records all name the same parts of a run file, and so does docs/run-file.md; spelled in
each, the names drift apart unseen. Code that names a part of a run file takes the name
from here, and tests/test_runfile_schema.py checks the source tree, docs/run-file.md and a
written file against this module. In a path, ``<id>`` is a stream's id, ``<host>`` an agent
host, ``<source>:<channel>`` a calibrated stream and ``<knob>`` a tuned setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from wattlab.samples import MARKER_NAME_MAX, MARKER_PAYLOAD_MAX

FORMAT_VERSION = "1"
"""Raised only when the layout changes so that an older reader would misread a file."""
UNKNOWN_TIME_NS = np.iinfo(np.int64).min
"""A time a table row does not know (``/gaps`` times, ``/markers`` ``time_gpu``)."""

# ------------------------------------------------------------ groups and tables at the root
SOURCES = "sources"
MARKERS = "markers"
GAPS = "gaps"
PROGRESS = "progress"
SYNC = "sync"
ANALYSIS = "analysis"

# ------------------------------------------------------------ attributes of the root
FORMAT_VERSION_ATTR = "format_version"
SESSION_START_MONOTONIC_NS = "session_start_monotonic_ns"
WRITER_JSON = "writer_json"
WATTLAB_VERSION = "wattlab_version"
CREATED = "created"
HOST = "host"
SESSION_START_UNIX_NS = "session_start_unix_ns"
COMMAND = "command"
BENCH_CONFIG = "bench_config"
RECORDER_HOST = "recorder_host"
SESSION_END_MONOTONIC_NS = "session_end_monotonic_ns"
RECORDER_STATUS_JSON = "recorder_status_json"
REPAIR_JSON = "repair_json"
STOPPED_BY = "stopped_by"
DISK_FULL_JSON = "disk_full_json"
SWEEP_SETTING_JSON = "sweep_setting_json"
TUNE_JSON = "tune_json"
DEMO_SEED = "demo_seed"
EXCITE_SEED = "excite_seed"
IMPORTED_FROM = "imported_from"
IMPORT_FORMAT = "import_format"
UNFINISHED = "unfinished"
RECORDING_CPU_JSON = "recording_cpu_json"

WRITER_ROOT_ATTRS = (FORMAT_VERSION_ATTR, SESSION_START_MONOTONIC_NS, WRITER_JSON)
"""What the writer itself sets when it creates a file."""
SESSION_ROOT_ATTRS = (WATTLAB_VERSION, CREATED, HOST, SESSION_START_UNIX_NS, COMMAND,
                      BENCH_CONFIG, RECORDER_HOST)
"""What a recording session hands the writer (an importer: the first three and ``command``)."""
CLOSE_ROOT_ATTRS = (SESSION_END_MONOTONIC_NS, RECORDER_STATUS_JSON)
"""What the recorder sets at a clean close."""
OCCASIONAL_ROOT_ATTRS = (REPAIR_JSON, STOPPED_BY, DISK_FULL_JSON, SWEEP_SETTING_JSON,
                         TUNE_JSON, DEMO_SEED, EXCITE_SEED, IMPORTED_FROM, IMPORT_FORMAT,
                         RECORDING_CPU_JSON)
"""Set by repair, a full disk, the command that recorded, an importer, or (the recording's
own CPU) a session at its clean close: files written before issue 39 lack it."""
WRITING_ROOT_ATTRS = (UNFINISHED,)
"""Set while a writer owns the file, removed as the last step of its clean close.

Why beside the superblock's flags: a writer closes and reopens the file (a new stream, the
final rewrite), and a kill between the two leaves flags that say "closed cleanly"."""
ROOT_ATTRS = (WRITER_ROOT_ATTRS + SESSION_ROOT_ATTRS + CLOSE_ROOT_ATTRS + OCCASIONAL_ROOT_ATTRS
              + WRITING_ROOT_ATTRS)

# ------------------------------------------------------------ one group per stream
KIND = "kind"
MODEL = "model"
SERIAL = "serial"
FIRMWARE = "firmware"
TRANSPORT = "transport"
TIME_RAW = "time_raw"
DESCRIPTOR_JSON = "descriptor_json"
CONFIG_JSON = "config_json"
REMOTE_HOST = "remote_host"
DESCRIPTOR_ATTRS = (KIND, MODEL, SERIAL, FIRMWARE, TRANSPORT, HOST, TIME_RAW)
"""Attributes copied from the stream descriptor's field of the same name."""
SOURCE_ATTRS = (*DESCRIPTOR_ATTRS, DESCRIPTOR_JSON, CONFIG_JSON, REMOTE_HOST)

TIME = "time"
VALUES = "values"
FLAGS = "flags"
TIME_HOST_RAW = "time_host_raw"
CLOCK_FIT = "clock_fit"
STREAM_DATASETS = (TIME, TIME_RAW, VALUES, FLAGS)
"""The datasets every stream has, row for row."""
REMOTE_STREAM_DATASETS = (*STREAM_DATASETS, TIME_HOST_RAW)
"""A remote agent's stream also keeps its host's own time of each row."""
STREAM_DATASET_KINDS = {TIME: ("i", 1), TIME_RAW: ("iuf", 1), VALUES: ("iuf", 2),
                        FLAGS: ("u", 1)}
"""numpy dtype kinds and dimensions a reader accepts (time_raw and values: the descriptor's)."""
TIME_DTYPE = "<i8"
FLAGS_DTYPE = "u1"

UNIT = "unit"
MAPPED_BY = "mapped_by"
MEANING = "meaning"
CHANNEL_NAMES = "channel_names"
UNITS = "units"
MEANINGS = "meanings"
FLAG_BITS = "flag_bits"
STREAM_DATASET_ATTRS = {TIME: (UNIT, MAPPED_BY), TIME_RAW: (MEANING,),
                        VALUES: (CHANNEL_NAMES, UNITS, MEANINGS), FLAGS: (FLAG_BITS,),
                        TIME_HOST_RAW: (MEANING,)}
"""``mapped_by``: a remote stream's ``time`` re-mapped at close."""

HOST_TIME = "host_time"
CLOCK_FIT_ATTRS = ("method", "device_ref", "host_ref_ns", "ns_per_unit", "nominal_ns_per_unit",
                   "drift_ppm", "n_points", "residual_p50_ns", "residual_p99_ns",
                   "residual_max_ns", MEANING, HOST_TIME)
"""The fit's own attributes (``device_models.clock_fit.ClockFit.to_attrs``) and ``host_time``."""

# ------------------------------------------------------------ the run-wide tables
SOURCE = "source"
NAME = "name"
PAYLOAD = "payload"
TIME_GPU = "time_gpu"
TIME_GPU_UNCERTAINTY = "time_gpu_uncertainty"
SEQ_FIRST = "seq_first"
SEQ_LAST = "seq_last"
TIME_FIRST = "time_first"
TIME_LAST = "time_last"
SAMPLES_LOST = "samples_lost"
REASON = "reason"
SEQ_NEXT = "seq_next"
ROWS = "rows"
ENDED = "ended"
SOURCE_ID_BYTES = 64
REASON_BYTES = 128

MARKER_DTYPE = np.dtype(
    [
        (TIME, "<i8"),
        (TIME_RAW, "<i8"),
        (KIND, "S5"),
        (SOURCE, f"S{SOURCE_ID_BYTES}"),
        (NAME, f"S{MARKER_NAME_MAX}"),
        (PAYLOAD, f"S{MARKER_PAYLOAD_MAX}"),
        # when the GPU reached the marker (ns since session start; UNKNOWN_TIME_NS: none)
        (TIME_GPU, "<i8"),
        (TIME_GPU_UNCERTAINTY, "<i8"),  # ns, half-width; -1 where there is no GPU time
    ]
)
MARKER_GPU_FIELDS = (TIME_GPU, TIME_GPU_UNCERTAINTY)
"""Added with GPU-time markers: files written before lack them, and are read all the same."""
MARKER_FIELDS = tuple(n for n in MARKER_DTYPE.names or () if n not in MARKER_GPU_FIELDS)
"""The marker fields every readable run file has."""
GAP_DTYPE = np.dtype(
    [
        (SOURCE, f"S{SOURCE_ID_BYTES}"),
        (SEQ_FIRST, "<i8"),
        (SEQ_LAST, "<i8"),
        (TIME_FIRST, "<i8"),
        (TIME_LAST, "<i8"),
        (SAMPLES_LOST, "<i8"),
        (REASON, f"S{REASON_BYTES}"),
    ]
)
GAP_FIELDS = tuple(GAP_DTYPE.names or ())
PROGRESS_DTYPE = np.dtype(
    [
        (SOURCE, f"S{SOURCE_ID_BYTES}"),
        (SEQ_NEXT, "<i8"),
        (ROWS, "<i8"),
        (ENDED, "u1"),
    ]
)
"""One row per source per flush: how far the file holds it (what a restarted recorder resumes)."""
TABLES = {MARKERS: MARKER_DTYPE, GAPS: GAP_DTYPE, PROGRESS: PROGRESS_DTYPE}
"""The run-wide tables at the root, appended to at every flush that has news."""
TIME_UNIT = "time_unit"
UNKNOWN_TIME = "unknown_time"
TABLE_ATTRS = {MARKERS: (TIME_UNIT, TIME_GPU), GAPS: (UNKNOWN_TIME,), PROGRESS: (MEANING,)}

# ------------------------------------------------------------ /sync/<host>: a remote host's clock
PROBES = "probes"
LOCAL_NS, REMOTE_NS, OFFSET_NS = "local_ns", "remote_ns", "offset_ns"
RTT_NS, FIT_OFFSET_NS = "rtt_ns", "fit_offset_ns"
SYNC_PROBES_DTYPE = np.dtype(
    [
        (LOCAL_NS, "<i8"),  # recorder monotonic ns at the probe's midpoint
        (REMOTE_NS, "<i8"),  # remote monotonic ns at the reply's midpoint
        (OFFSET_NS, "<f8"),  # remote - local measured by the window's best probe
        (RTT_NS, "<i8"),  # its round trip, less the remote's turnaround
        (FIT_OFFSET_NS, "<f8"),  # remote - local by the final model at that instant
        (PROBES, "<i8"),  # probes in the window
    ]
)
"""The clock service's window-best probes, one row per window."""
PROBES_REJECTED, WINDOWS, DRIFT_PPM = "probes_rejected", "windows", "drift_ppm"
RTT_MIN_NS, RTT_MEDIAN_NS, RESIDUAL_RMS_NS = "rtt_min_ns", "rtt_median_ns", "residual_rms_ns"
WINDOW_S, FIT_SPAN_S = "window_s", "fit_span_s"
SYNC_ATTRS = (HOST, PROBES, PROBES_REJECTED, WINDOWS, OFFSET_NS, DRIFT_PPM, RTT_MIN_NS,
              RTT_MEDIAN_NS, RESIDUAL_RMS_NS, WINDOW_S, FIT_SPAN_S)
"""The clock model's summary (``sync/clock_service.ClockTracker.summary``), as attributes."""

# ------------------------------------------------------------ /analysis/<record>
CALIBRATION = "calibration"
LAYERS = "layers"
TUNING = "tuning"
RECORD_JSON = "record_json"
KERNEL = "kernel"
IDENTIFIABLE = "identifiable"
ALL_VALID = "all_valid"
"""Every figure of the record passed its validity verdict (issue 37; older records lack it)."""
CALIBRATION_PARAMS = ("tau_s", "w_s", "time_constant_s", "gain", "offset_w")
"""A fitted parameter is also an attribute where the data pinned it (w_s: boxcar kernels,
time_constant_s: first-order ones)."""
CALIBRATION_ATTRS = (RECORD_JSON, KERNEL, IDENTIFIABLE, ALL_VALID, *CALIBRATION_PARAMS)
SUMMARY_JSON = "summary_json"
MODELS_JSON = "models_json"
DECISIONS_JSON = "decisions_json"
ITERATION_SOURCE = "iteration_source"
KNOBS = "knobs"
CHANGES_JSON = "changes_json"
TUNING_ATTRS = (SUMMARY_JSON, MODELS_JSON, DECISIONS_JSON, ITERATION_SOURCE, KNOBS,
                CHANGES_JSON)
ITERATIONS = "iterations"
PURPOSE = "purpose"
PROBE_COLUMNS = ("energy_j", "energy_se_j", "time_s", "time_se_s", ITERATIONS, PURPOSE)
"""``/analysis/tuning/probes``: these after one dataset per knob, one row per probe."""
ITERATION_COLUMNS = ("start_ns", "end_ns", "energy_j", "probe", "used")
"""``/analysis/tuning/iterations``: one row per iteration the tuner saw."""
REQUESTS = "requests"
REQUEST_ATTRS = ("log", "format", "skipped", "mapping")
REQUEST_ID = "id"
REQUEST_COLUMNS = ("start_s", "first_token_s", "end_s", "prompt_tokens", "output_tokens")
REQUEST_SCHEDULED = "scheduled_s"
"""The optional column: when each prefill started (NaN where the log did not say; absent
from tables written before it existed)."""
"""``/analysis/requests``: after ``id``, one array per column, one row per request
(`wattlab import requests`; session seconds, NaN where a request had no first token)."""


@dataclass(frozen=True)
class Node:
    """One group or dataset of the layout and the attributes it may carry.

    ``row``: a table's row type (None: a group, or an array whose type the data decides).
    """

    path: str
    group: bool
    attrs: tuple[str, ...] = ()
    row: np.dtype[Any] | None = None


def _record(*parts: str) -> str:
    return "/".join(("", ANALYSIS, *parts))


LAYOUT = (
    Node("/", True, ROOT_ATTRS),
    Node(f"/{SOURCES}", True),
    Node(f"/{SOURCES}/<id>", True, SOURCE_ATTRS),
    *(Node(f"/{SOURCES}/<id>/{name}", False, attrs)
      for name, attrs in STREAM_DATASET_ATTRS.items()),
    Node(f"/{SOURCES}/<id>/{CLOCK_FIT}", True, CLOCK_FIT_ATTRS),
    *(Node(f"/{name}", False, TABLE_ATTRS[name], row) for name, row in TABLES.items()),
    Node(f"/{SYNC}", True),
    Node(f"/{SYNC}/<host>", True, SYNC_ATTRS),
    Node(f"/{SYNC}/<host>/{PROBES}", False, (MEANING,), SYNC_PROBES_DTYPE),
    Node(_record(), True),
    Node(_record(CALIBRATION), True),
    Node(_record(CALIBRATION, "<source>:<channel>"), True, CALIBRATION_ATTRS),
    Node(_record(LAYERS), True, (RECORD_JSON,)),
    Node(_record(TUNING), True, TUNING_ATTRS),
    Node(_record(TUNING, PROBES), True),
    *(Node(_record(TUNING, PROBES, name), False) for name in ("<knob>", *PROBE_COLUMNS)),
    Node(_record(TUNING, ITERATIONS), True),
    *(Node(_record(TUNING, ITERATIONS, name), False) for name in ITERATION_COLUMNS),
    Node(_record(REQUESTS), True, REQUEST_ATTRS),
    *(Node(_record(REQUESTS, name), False)
      for name in (REQUEST_ID, *REQUEST_COLUMNS, REQUEST_SCHEDULED)),
)
"""Every group and dataset a run file may hold."""


def _names() -> tuple[str, ...]:
    found: set[str] = set()
    for node in LAYOUT:
        found.update(p for p in node.path.split("/") if p and not p.startswith("<"))
        found.update(node.attrs)
        found.update(node.row.names or () if node.row is not None else ())
    return tuple(sorted(found))


NAMES = _names()
"""Every group, dataset, table, field and attribute name of the layout, sorted."""
