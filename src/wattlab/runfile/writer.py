"""Writes the HDF5 run file (the layout: runfile/schema.py, docs/run-file.md; how: docs/design.md).

SWMR rules shape this file: once SWMR writing starts no object may be created and
variable-length data is unsafe, so markers and gaps use fixed-size string fields and a
source that appears after SWMR started is added by closing and reopening the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from wattlab.device_models import NOMINAL_NS_PER_UNIT, EnvelopeAccumulator
from wattlab.errors import RunFileError, UsageError
from wattlab.runfile import schema
from wattlab.runfile.processes import writer_identity
from wattlab.runfile.table_rows import gap_rows, marker_rows, progress_rows
from wattlab.samples import Gap, Marker, SourceDescriptor, flag_names

CHUNK_BYTES = 512 * 1024
CLOSE_PASS_ROWS = 1 << 20  # rows per read when re-timing or fitting at close
# Oldest format that SWMR allows (superblock v3), newest objects where HDF5 needs them: a
# low bound of "latest" would write HDF5-2.0 compound types that HDF5 1.10/1.12 tools
# (h5dump, HDFView, MATLAB) cannot read.
LIBVER = ("v110", "latest")
UNFINISHED_MEANING = ("a writer has this file; its clean close removes this attribute, so a "
                      "file that still holds it after its writer is gone needs wattlab repair")

# the gap row's reason after the cause (128 bytes in all): a kill between creating a
# source's group and writing it
UNREADABLE = "its group was not whole on disk: every row of it lost"


@dataclass(frozen=True)
class ResumePoint:
    """Where a source stands in a file reopened after a crash."""

    seq_next: int
    rows: int
    ended: bool
    rows_dropped: int  # rows cut off on reopen (torn, or after the last complete flush)
    rows_unconfirmed: int = 0  # rows kept beyond the last /progress record (repair only)


class _ChunkColumn:
    """Appends to one growable dataset by writing whole chunks (``write_direct_chunk``).

    Why: h5py's hyperslab append copies every row into HDF5's chunk cache before it goes to
    disk and costs Python and HDF5 selection work per call; a staged chunk goes to disk in
    one call. Rows wait in a chunk-sized staging buffer; ``flush`` writes the rows of the
    partial last chunk not yet on disk (and sets the extent to the rows held), so a SWMR
    reader and a resumed recorder see every flushed row. The dataset is opened without a
    chunk cache, so that tail write puts only its own bytes on disk, not the whole 512 KiB
    chunk at every flush of a slow source.
    """

    def __init__(self, ds: h5py.Dataset) -> None:
        self.ds = ds
        chunks = ds.chunks
        if chunks is None or ds.compression is not None or ds.chunks[1:] != ds.shape[1:]:
            raise RunFileError(f"{ds.name}: not an uncompressed row-chunked dataset")
        self.chunk_rows = int(chunks[0])
        self._buf = np.zeros(chunks, dtype=ds.dtype)
        rows = int(ds.shape[0])
        self._base = rows - rows % self.chunk_rows  # first row of the staged chunk
        self._fill = rows - self._base
        if self._fill:  # a resumed file: carry on its partial last chunk
            self._buf[: self._fill] = ds[self._base : rows]
        self._on_disk = self._fill  # rows of the staged chunk already in the file
        self._extent = rows  # the dataset's length, kept here: asking HDF5 costs a call

    @property
    def rows(self) -> int:
        return self._base + self._fill

    def append(self, data: npt.NDArray[Any], minus: int = 0) -> None:
        """Stage rows (``data - minus``); every chunk that fills goes to disk at once."""
        n, pos, size = int(data.shape[0]), 0, self.chunk_rows
        whole = (self._fill + n) // size  # chunks this call completes: one resize for all
        if whole:
            self._resize(self._base + whole * size)
        while pos < n:
            take = min(size - self._fill, n - pos)
            part = data[pos : pos + take]
            if take == size and minus == 0 and part.dtype == self._buf.dtype and (
                    part.flags.c_contiguous):
                self._write(self._base, part)  # a whole chunk straight from the input
                self._base += size
            else:
                target = self._buf[self._fill : self._fill + take]
                if minus:
                    np.subtract(part, minus, out=target, casting="unsafe")
                else:
                    np.copyto(target, part, casting="unsafe")
                self._fill += take
                if self._fill == size:
                    self._write(self._base, self._buf)
                    self._base += size
                    self._fill = self._on_disk = 0
            pos += take

    def flush(self) -> None:
        """The staged rows not yet on disk to disk; the extent to exactly the rows held."""
        if self._fill > self._on_disk:
            start, end = self._base + self._on_disk, self._base + self._fill
            self._resize(end)
            _write_rows(self.ds, start, self._buf[self._on_disk : self._fill])
            self._on_disk = self._fill

    def _resize(self, rows: int) -> None:
        """The extent to ``rows``, through the low-level call.

        h5py's ``resize`` asks HDF5 for the shape and the chunks each time: a third of a
        resize's CPU, and the recorder resizes every column with new rows at every flush.
        """
        if rows != self._extent:
            self.ds.id.set_extent((rows, *self._buf.shape[1:]))
            self._extent = rows

    def _write(self, start: int, chunk: npt.NDArray[Any]) -> None:
        self.ds.id.write_direct_chunk((start,) + (0,) * (chunk.ndim - 1), chunk)


@dataclass
class _SourceDatasets:
    time: _ChunkColumn
    time_raw: _ChunkColumn
    values: _ChunkColumn
    flags: _ChunkColumn
    time_host_raw: _ChunkColumn | None = None

    def columns(self) -> list[_ChunkColumn]:
        extra = [] if self.time_host_raw is None else [self.time_host_raw]
        return [self.time, self.time_raw, self.values, self.flags, *extra]


def _growable(
    group: h5py.Group, name: str, dtype: Any, width: int | None = None,
    chunk_rows: int | None = None, **kw: Any,
) -> Any:
    """A dataset that grows along its first axis; chunks of ~CHUNK_BYTES for fast appends."""
    shape = (0,) if width is None else (0, width)
    maxshape = (None,) if width is None else (None, width)
    row_bytes = np.dtype(dtype).itemsize * (width or 1)
    rows = chunk_rows or max(64, CHUNK_BYTES // row_bytes)
    chunks = (rows,) if width is None else (rows, width)
    return group.create_dataset(name, shape, maxshape=maxshape, dtype=dtype, chunks=chunks, **kw)


def _uncached(group: h5py.Group, name: str) -> h5py.Dataset:
    """A dataset opened with no chunk cache: writes go straight to the file (see _ChunkColumn)."""
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(0, 0, 1.0)
    return h5py.Dataset(h5py.h5d.open(group.id, name.encode(), dapl=dapl))


def _write_rows(ds: h5py.Dataset, start: int, data: npt.NDArray[Any]) -> None:
    """Rows ``start ..`` of ``ds`` from ``data`` (same dtype), through the low-level API.

    h5py's slice assignment works out shapes, dtypes and selections in Python on every
    call; the recorder writes small tails of many datasets at every flush, and that was
    most of its CPU while recording a GPU.
    """
    rows = np.ascontiguousarray(data)
    space = ds.id.get_space()
    space.select_hyperslab((start,) + (0,) * (rows.ndim - 1), rows.shape)
    ds.id.write(h5py.h5s.create_simple(rows.shape), space, rows)


def _append(ds: h5py.Dataset, data: npt.NDArray[Any]) -> None:
    start = ds.shape[0]
    ds.resize(start + data.shape[0], axis=0)
    _write_rows(ds, start, data)


def remove_unwhole_sources(sources: h5py.Group) -> list[str]:
    """The sources a kill left unwhole, removed: their names.

    A kill can leave a source's link to an object never written, or its group without its
    descriptor yet: none of its rows can be read.
    """
    unwhole = [sid for sid in sources if not isinstance(group := sources.get(sid), h5py.Group)
               or schema.DESCRIPTOR_JSON not in group.attrs]
    for sid in unwhole:
        del sources[sid]
    return unwhole


def unreadable_gaps(writer: RunFileWriter, why: str, until_ns: int = -1,
                    rows_sent: Mapping[str, int] | None = None) -> list[Gap]:
    """A gap row for each source ``writer``'s resume removed (``remove_unwhole_sources``)."""
    return [Gap(sid, f"{why}: {UNREADABLE}", t_last_ns=until_ns,
                samples_lost=(rows_sent or {}).get(sid, -1)) for sid in writer.sources_unreadable]


class RunFileWriter:
    """Owns one run file from creation to close; never opens an existing path for writing."""

    def __init__(self, path: str, root_attrs: dict[str, Any], session_start_ns: int) -> None:
        if os.path.exists(path):
            raise UsageError(f"{path}: already exists; wattlab never overwrites a run file")
        self.path = path
        self.session_start_ns = session_start_ns
        try:
            self._file = h5py.File(path, "x", libver=LIBVER, locking=False)
        except (OSError, ValueError) as e:
            raise UsageError(f"{path}: cannot create run file: {e}") from e
        for key, value in root_attrs.items():
            self._file.attrs[key] = value
        self._file.attrs[schema.FORMAT_VERSION_ATTR] = schema.FORMAT_VERSION
        self._file.attrs[schema.SESSION_START_MONOTONIC_NS] = session_start_ns
        self._file.attrs[schema.WRITER_JSON] = json.dumps(writer_identity())
        self._file.attrs[schema.UNFINISHED] = UNFINISHED_MEANING
        self._file.create_group(schema.SOURCES)
        for name, dtype in schema.TABLES.items():
            _growable(self._file, name, dtype, chunk_rows=64, compression="gzip",
                      compression_opts=1)
        markers = self._file[schema.MARKERS]
        markers.attrs[schema.TIME_UNIT] = "ns since session start"
        markers.attrs[schema.TIME_GPU] = (
            "when the GPU executed the marker's point of its work (a CUDA event), on the "
            "session timebase; time is when the host reached it")
        self._file[schema.GAPS].attrs[schema.UNKNOWN_TIME] = schema.UNKNOWN_TIME_NS
        self._file[schema.PROGRESS].attrs[schema.MEANING] = (
            "per flush: the next sequence number and row count of each source on disk; "
            "a recorder restarted after a crash resumes from the last complete row")
        self._tables = self._open_tables()
        self._sources: dict[str, _SourceDatasets] = {}
        self._descriptors: dict[str, SourceDescriptor] = {}
        self.tables_dropped: dict[str, int] = {}  # blank rows cut from /markers... on resume

    @classmethod
    def resume(
        cls, path: str, session_start_ns: int, *, keep_unconfirmed: bool = False,
        stamp_writer: bool = True,
    ) -> tuple[RunFileWriter, dict[str, ResumePoint]]:
        """Reopen a run file whose recorder died, cut back to its last complete flush.

        Why cut: rows written after the last flush may be partly on disk (one dataset longer
        than another); the ``progress`` table says where each source was whole, and the
        sources resend from there. ``keep_unconfirmed`` (``wattlab repair``, where nothing
        will be resent) keeps the rows after it that every dataset holds whole.
        ``stamp_writer=False`` leaves the writer attribute as it is: rewriting it needs room
        in the file, which a file at its size limit (``ulimit -f``) does not have.
        """
        from wattlab.runfile.crash_flags import clear_crash_flags

        if not os.path.exists(path):
            raise UsageError(f"{path}: no run file to resume")
        clear_crash_flags(path)
        self = cls.__new__(cls)
        self.path = path
        self.session_start_ns = session_start_ns
        try:
            self._file = h5py.File(path, "r+", libver=LIBVER, locking=False)
        except OSError as e:
            raise RunFileError(f"{path}: cannot reopen for writing: {e}") from e
        try:
            if schema.PROGRESS not in self._file or schema.SOURCES not in self._file:
                raise RunFileError(f"{path}: not a resumable run file (no /progress)")
            self._sources = {}
            self._descriptors = {}
            self.tables_dropped = self._drop_blank_table_rows()
            points = self._cut_to_progress(keep_unconfirmed)
            self._tables = self._open_tables()
            if stamp_writer:
                self._file.attrs[schema.WRITER_JSON] = json.dumps(writer_identity())
                self._file.attrs[schema.UNFINISHED] = UNFINISHED_MEANING
        except (RunFileError, KeyError, ValueError, RuntimeError) as e:
            # RuntimeError: HDF5 could not iterate a damaged index (of /sources)
            self._file.close()
            if isinstance(e, RunFileError):
                raise
            raise RunFileError(f"{path}: cannot resume: {e}") from e
        return self, points

    def _open_tables(self) -> dict[str, h5py.Dataset]:
        """The markers, gaps and progress tables, opened once.

        Looking a dataset up by name cost about a third of a millisecond at every flush.
        """
        return {name: self._file[name] for name in schema.TABLES}

    def _drop_blank_table_rows(self) -> dict[str, int]:
        """Rows of the run-wide tables a dead writer had sized but not filled, dropped."""
        return {name: _drop_blank_tail(self._file[name]) for name in schema.TABLES}

    def _cut_to_progress(self, keep_unconfirmed: bool) -> dict[str, ResumePoint]:
        table = self._file[schema.PROGRESS][:]
        points: dict[str, ResumePoint] = {}
        self.sources_unreadable = remove_unwhole_sources(self._file[schema.SOURCES])
        for source_id, group in self._file[schema.SOURCES].items():
            desc = SourceDescriptor.from_json(json.loads(group.attrs[schema.DESCRIPTOR_JSON]))
            self._descriptors[source_id] = desc
            parts = [group[name] for name in schema.REMOTE_STREAM_DATASETS if name in group]
            whole = min(_backed_rows(p) for p in parts)
            mine = table[table[schema.SOURCE] == source_id.encode()]
            mine = mine[mine[schema.ROWS] <= whole]
            seq_next, rows, ended = (0, 0, False) if len(mine) == 0 else (
                int(mine[schema.SEQ_NEXT][-1]), int(mine[schema.ROWS][-1]),
                bool(mine[schema.ENDED][-1]))
            longest = max(int(p.shape[0]) for p in parts)
            kept = _whole_rows(group, rows, whole) if keep_unconfirmed else rows
            for p in parts:
                p.resize(kept, axis=0)
            self._bind(source_id)  # after the cut: staging starts from the kept rows
            points[source_id] = ResumePoint(seq_next, rows, ended, longest - kept, kept - rows)
        return points

    @property
    def swmr(self) -> bool:
        return bool(self._file.swmr_mode)

    def start_swmr(self) -> None:
        """From here on, a live reader can follow the file (`wattlab.open` on a growing run)."""
        if not self.swmr:
            self._file.swmr_mode = True

    def has_source(self, source_id: str) -> bool:
        return source_id in self._sources

    def descriptor(self, source_id: str) -> SourceDescriptor:
        return self._descriptors[source_id]

    def last_times_ns(self, source_id: str, rows: int) -> npt.NDArray[np.int64]:
        """Session times of a source's last ``rows`` rows on disk."""
        column = self._sources[source_id].time
        end = column.rows
        return np.asarray(column.ds[max(0, end - rows):end], dtype=np.int64)

    def remote_host(self, source_id: str) -> str:
        """The agent host a stream came from ("" for this host's own)."""
        return str(self._file[schema.SOURCES][source_id].attrs.get(schema.REMOTE_HOST, ""))

    def add_source(self, desc: SourceDescriptor, remote_host: str = "") -> None:
        """Create a source's group; a remote host's source also keeps the sender's times."""
        if desc.source_id in self._sources:
            # a restarted source may differ in its configuration (clock offsets, ...) but
            # never in what its datasets hold
            if _layout(desc) != _layout(self._descriptors[desc.source_id]):
                raise UsageError(f"source {desc.source_id!r} re-announced with another descriptor")
            return
        was_swmr = self.swmr
        if was_swmr:
            self._reopen_for_new_objects()
        group = self._file[schema.SOURCES].create_group(desc.source_id)
        for key in schema.DESCRIPTOR_ATTRS:
            group.attrs[key] = getattr(desc, key)
        group.attrs[schema.DESCRIPTOR_JSON] = json.dumps(desc.to_json(), sort_keys=True)
        group.attrs[schema.CONFIG_JSON] = json.dumps(desc.config, sort_keys=True)
        width = len(desc.channels)
        time_ds = _growable(group, schema.TIME, schema.TIME_DTYPE)
        time_ds.attrs[schema.UNIT] = "ns since session start (session timebase)"
        raw_ds = _growable(group, schema.TIME_RAW, desc.time_raw_dtype)
        raw_ds.attrs[schema.MEANING] = desc.time_raw
        values = _growable(group, schema.VALUES, desc.value_dtype, width)
        values.attrs[schema.CHANNEL_NAMES] = [c.name for c in desc.channels]
        values.attrs[schema.UNITS] = [c.unit for c in desc.channels]
        values.attrs[schema.MEANINGS] = [c.meaning or "-" for c in desc.channels]
        flags = _growable(group, schema.FLAGS, schema.FLAGS_DTYPE)
        flags.attrs[schema.FLAG_BITS] = json.dumps(flag_names(), sort_keys=True)
        if remote_host:
            group.attrs[schema.REMOTE_HOST] = remote_host
            sender = _growable(group, schema.TIME_HOST_RAW, schema.TIME_DTYPE)
            sender.attrs[schema.MEANING] = (
                f"monotonic ns of host {remote_host!r} when read; "
                f"mapped by /{schema.SYNC}/{remote_host} onto '{schema.TIME}'")
        self._descriptors[desc.source_id] = desc
        self._bind(desc.source_id)
        if was_swmr:
            self.start_swmr()

    def _bind(self, source_id: str) -> None:
        group = self._file[schema.SOURCES][source_id]
        columns = [_ChunkColumn(_uncached(group, name)) if name in group else None
                   for name in schema.REMOTE_STREAM_DATASETS]
        time_ds, raw, values, flags, sender = columns
        if time_ds is None or raw is None or values is None or flags is None:
            raise RunFileError(f"{self.path}: source {source_id!r} lacks a dataset")
        self._sources[source_id] = _SourceDatasets(time_ds, raw, values, flags, sender)

    def _reopen_for_new_objects(self) -> None:
        self.flush()
        self._file.close()
        try:
            self._file = h5py.File(self.path, "r+", libver=LIBVER, locking=False)
        except OSError as e:
            raise RunFileError(f"{self.path}: could not reopen to add a source: {e}") from e
        for source_id in self._descriptors:
            self._bind(source_id)
        self._tables = self._open_tables()

    def append(
        self,
        source_id: str,
        t_host_ns: npt.NDArray[np.int64],
        t_raw: npt.NDArray[Any],
        values: npt.NDArray[Any],
        flags: npt.NDArray[np.uint8],
        *,
        t_sender_ns: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """Append rows to a source; time goes onto the session timebase here.

        ``t_host_ns`` is already on the recorder host's clock; ``t_sender_ns`` is the remote
        host's own time of the same rows (remote sources only).
        """
        ds = self._sources[source_id]
        if ds.time_host_raw is not None and t_sender_ns is None:
            raise UsageError(f"source {source_id!r} is remote: its sender times are needed")
        ds.time.append(t_host_ns, minus=self.session_start_ns)
        ds.time_raw.append(t_raw)
        ds.values.append(values)
        ds.flags.append(flags)
        if ds.time_host_raw is not None and t_sender_ns is not None:
            ds.time_host_raw.append(t_sender_ns)

    def add_markers(self, markers: list[Marker]) -> None:
        table = self._tables[schema.MARKERS]  # a resumed older file: its own columns
        _append(table, marker_rows(markers, table.dtype, self.session_start_ns))

    def add_gaps(self, gaps: list[Gap]) -> None:
        _append(self._tables[schema.GAPS], gap_rows(gaps, self.session_start_ns))

    def add_progress(self, rows: list[tuple[str, int, int, bool]]) -> None:
        """(source, next sequence number, rows written, ended) after the data they cover."""
        _append(self._tables[schema.PROGRESS], progress_rows(rows))

    def last_time_ns(self) -> dict[str, int | None]:
        """Each source's last session time on disk (None: no rows yet)."""
        out: dict[str, int | None] = {}
        for source_id, ds in self._sources.items():
            rows = ds.time.rows
            out[source_id] = int(ds.time.ds[rows - 1]) if rows else None
        return out

    def set_attr(self, key: str, value: Any) -> None:
        """Root attributes can only be written before SWMR starts, or at close."""
        self._file.attrs[key] = value

    def flush_rows(self) -> None:
        """Staged rows to disk: before the /progress row that says they are there."""
        for ds in self._sources.values():
            for column in ds.columns():
                column.flush()

    def flush(self) -> None:
        """Staged rows to disk, then HDF5's own flush (what SWMR readers see)."""
        self.flush_rows()
        self._file.flush()

    def close(
        self,
        final_attrs: dict[str, Any] | None = None,
        sync: dict[str, tuple[npt.NDArray[Any], dict[str, Any]]] | None = None,
        remaps: dict[str, Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]]] | None = None,
        fit_device_clocks: bool = True,
        finished: bool = True,
    ) -> None:
        """Close; what needs new objects or rewrites happens in a short non-SWMR reopen.

        ``sync``: per host, the clock-service table and its summary (``/sync/<host>``).
        ``remaps``: per remote source, the final sender → recorder clock mapping; its
        ``time`` is recomputed from ``time_host_raw`` (the live mapping only extrapolated).
        ``fit_device_clocks``: fit every device-clocked source's raw time against its
        session time and store the fit under ``/sources/<id>/clock_fit``.
        ``finished=False``: release the file only (an error path); it stays marked unfinished,
        for `wattlab repair`.
        """
        self.flush()
        self._file.close()
        if not finished:
            return
        with h5py.File(self.path, "r+", libver=LIBVER, locking=False) as f:
            for key, value in (final_attrs or {}).items():
                f.attrs[key] = value
            for host, (rows, attrs) in (sync or {}).items():
                group = f.require_group(schema.SYNC).create_group(host)
                table = group.create_dataset(schema.PROBES, data=rows)
                table.attrs[schema.MEANING] = (
                    "best (smallest round-trip) probe per window: local = recorder monotonic "
                    "ns, remote = host's; offset = remote - local")
                for key, value in attrs.items():
                    group.attrs[key] = value
            for source_id, mapping in (remaps or {}).items():
                _remap(f[schema.SOURCES][source_id], mapping, self.session_start_ns)
            if fit_device_clocks:
                for source_id, desc in self._descriptors.items():
                    nominal = NOMINAL_NS_PER_UNIT.get(desc.time_raw)
                    if nominal is not None and desc.time_raw.startswith("device_"):
                        _fit_clock(f[schema.SOURCES][source_id], nominal)
            if schema.UNFINISHED in f.attrs:  # last: everything above is on disk
                del f.attrs[schema.UNFINISHED]


def _layout(desc: SourceDescriptor) -> dict[str, Any]:
    """What a source's datasets are: everything in its descriptor but the configuration."""
    return {k: v for k, v in desc.to_json().items() if k != "config"}


def _backed_rows(ds: h5py.Dataset) -> int:
    """Rows of ``ds`` whose chunks are in the file: up to the first chunk it lacks.

    Why: a flush that failed half-way (a full disk) can leave a dataset's extent on disk
    but not the index entry of its last chunk; those rows would read as zeros.
    """
    rows = int(ds.shape[0])
    chunk_rows = int(ds.chunks[0])
    expected = -(-rows // chunk_rows)
    if ds.id.get_num_chunks() >= expected:
        return rows
    have = {ds.id.get_chunk_info(i).chunk_offset[0] // chunk_rows
            for i in range(ds.id.get_num_chunks())}
    first_missing = next(k for k in range(expected) if k not in have)
    return first_missing * chunk_rows


def _drop_blank_tail(ds: h5py.Dataset) -> int:
    """Rows a dead writer had sized but not filled read as all zero: drop them (how many).

    The file's own row type, not today's: a file from before a column was added resumes too.
    """
    n = int(ds.shape[0])
    keep = n
    blank = np.zeros((), dtype=ds.dtype).tobytes()
    while keep > 0 and ds[keep - 1].tobytes() == blank:
        keep -= 1
    if keep < n:
        ds.resize(keep, axis=0)
    return n - keep


def _whole_rows(group: h5py.Group, confirmed: int, held: int) -> int:
    """Rows that are whole: the confirmed ones, then those every dataset holds on disk.

    Beyond ``confirmed`` (the last /progress record) a row counts up to ``held`` (the
    shortest dataset's length) if its chunk is on disk in every dataset and it has a
    session time. Why these tests: a dead writer's last flush may have put a dataset's new
    length on disk but not the chunk behind it (HDF5 then reads the fill value, 0, and says
    the chunk is not allocated), or sized a partial chunk and died before writing into it
    (zeros again); values and flags may legitimately be 0, but a row's session time never is.
    """
    parts = [group[name] for name in schema.REMOTE_STREAM_DATASETS if name in group]
    rows = held
    for ds in parts:
        chunk = int(ds.chunks[0])
        for start in range(confirmed - confirmed % chunk, rows, chunk):
            if ds.id.get_chunk_info_by_coord((start,) + (0,) * (ds.ndim - 1)).byte_offset is None:
                rows = max(confirmed, start)
                break
    zero = np.flatnonzero(group[schema.TIME][confirmed:rows] == 0)
    return confirmed + int(zero[0]) if zero.size else rows


def _remap(
    group: h5py.Group, mapping: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]],
    session_start_ns: int,
) -> None:
    sender, time_ds = group[schema.TIME_HOST_RAW], group[schema.TIME]
    for start in range(0, sender.shape[0], CLOSE_PASS_ROWS):
        stop = min(start + CLOSE_PASS_ROWS, sender.shape[0])
        time_ds[start:stop] = mapping(sender[start:stop]) - session_start_ns
    time_ds.attrs[schema.MAPPED_BY] = (f"final clock-service model "
                                       f"(see /{schema.SYNC}/<{schema.REMOTE_HOST}>)")


def _fit_clock(group: h5py.Group, nominal_ns_per_unit: float) -> None:
    """Device raw time → session time by the lower envelope, with residual statistics."""
    raw, time_ds = group[schema.TIME_RAW], group[schema.TIME]
    n = raw.shape[0]
    if n < 2:
        return
    acc = EnvelopeAccumulator(nominal_ns_per_unit)
    for start in range(0, n, CLOSE_PASS_ROWS):
        acc.add(raw[start:start + CLOSE_PASS_ROWS], time_ds[start:start + CLOSE_PASS_ROWS])
    fit = acc.fit()
    if fit is None:
        return
    step = max(1, n // 2_000_000)  # percentiles from at most ~2 M rows, max from all
    kept: list[npt.NDArray[np.float64]] = []
    worst = 0.0
    for start in range(0, n, CLOSE_PASS_ROWS):
        r = fit.residuals_ns(raw[start:start + CLOSE_PASS_ROWS],
                             time_ds[start:start + CLOSE_PASS_ROWS])
        worst = max(worst, float(np.max(r)))
        kept.append(r[::step])
    fit = fit.with_residuals(np.concatenate(kept))
    fit = replace(fit, residual_max_ns=worst)
    target = group.require_group(schema.CLOCK_FIT)
    for key, value in fit.to_attrs().items():
        target.attrs[key] = value
    target.attrs[schema.HOST_TIME] = f"session time (the '{schema.TIME}' dataset), ns"
