"""Typed, read-only access to a run file, also while the recorder is still writing it.

Datasets are read lazily and in slices, so a one-hour 20 kHz recording is never loaded
whole unless the caller asks for a whole array.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import h5py
import numpy as np
import numpy.typing as npt

from wattlab.errors import RunFileError
from wattlab.frames_import import frames_module
from wattlab.runfile import schema
from wattlab.runfile.h5_read import open_read_only, read_attr, read_head, read_rows
from wattlab.runfile.layout_check import SourceLayout, check_layout, check_not_truncated

COLUMN_READ_BYTES = 1 << 22  # whole rows read at a time for one column (``column_slice``)
HEAD_ROWS = 10_000  # enough rows for a robust median spacing, cheap on huge files
T = TypeVar("T")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class MarkerRow:
    """One marker: time in ns since session start, kind point/begin/end, JSON payload.

    ``time_ns`` is when the host reached the marker; ``gpu_time_ns`` (None in files
    before GPU markers, or for host-only markers) when the GPU executed that point of
    its queued work, which is what energy windows use where present.
    """

    time_ns: int
    name: str
    kind: str
    source: str
    payload: dict[str, Any]
    gpu_time_ns: int | None = None
    gpu_uncertainty_ns: int | None = None

    @property
    def effective_ns(self) -> int:
        """The GPU's time where there is one, else the host's."""
        return self.time_ns if self.gpu_time_ns is None else self.gpu_time_ns


def marker_rows(rows: npt.NDArray[Any]) -> list[MarkerRow]:
    """``/markers`` rows as read from the file (a file from before GPU markers too)."""
    gpu = schema.TIME_GPU in (rows.dtype.names or ())

    def gpu_of(r: Any) -> tuple[int | None, int | None]:
        if not gpu or int(r[schema.TIME_GPU]) == schema.UNKNOWN_TIME_NS:
            return None, None
        return int(r[schema.TIME_GPU]), int(r[schema.TIME_GPU_UNCERTAINTY])

    return [
        MarkerRow(int(r[schema.TIME]), _text(r[schema.NAME]), _text(r[schema.KIND]),
                  _text(r[schema.SOURCE]), json.loads(_text(r[schema.PAYLOAD]) or "{}"),
                  *gpu_of(r))
        for r in rows
    ]


@dataclass(frozen=True)
class GapRow:
    """One gap: times are ns since session start, or None where unknown."""

    source: str
    seq_first: int
    seq_last: int
    time_first_ns: int | None
    time_last_ns: int | None
    samples_lost: int
    reason: str


class SourceView:
    """One stream of a run: descriptor, channels, and its datasets.

    ``layout``: what ``layout_check.check_source`` already read of the group (else read here).
    Values derived from the data (``memo``) are kept until ``refresh``: every h5py lookup
    costs ~0.1 ms, and an analysis asks for a stream's length and span many times.
    """

    def __init__(self, source_id: str, group: h5py.Group,
                 layout: SourceLayout | None = None) -> None:
        self.source_id = source_id
        self._group = group
        try:
            if layout is None:
                layout = SourceLayout(
                    group, {name: group[name] for name in schema.STREAM_DATASETS},
                    json.loads(group.attrs[schema.DESCRIPTOR_JSON]),
                    list(group[schema.VALUES].attrs[schema.CHANNEL_NAMES]))
            self.descriptor: dict[str, Any] = layout.descriptor
            self._ds = layout.datasets
            self.channel_names = [_text(c) for c in layout.channel_names]
            self.units = [_text(u) for u in read_attr(self._ds[schema.VALUES], schema.UNITS)]
        except (KeyError, json.JSONDecodeError) as e:
            raise RunFileError(f"source {source_id!r}: malformed source group ({e})") from e
        self.kind = str(self.descriptor.get("kind", ""))
        self.model = str(self.descriptor.get("model", ""))
        # fixed for the file's life (rows are only appended): asked for every slice read
        self.values_dtype = self._ds[schema.VALUES].id.dtype
        self.row_bytes = self.values_dtype.itemsize * len(self.channel_names)
        """Bytes of one row of values (every channel)."""
        self._memo: dict[str, Any] = {}

    @property
    def path(self) -> str:
        """The run file holding the stream, for messages that must name both."""
        return str(self._group.file.filename)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()``, once until the next ``refresh``."""
        if key not in self._memo:
            self._memo[key] = compute()
        return cast(T, self._memo[key])

    def __len__(self) -> int:
        """Rows every dataset of the stream holds.

        Why not the time column's length: a live writer resizes the datasets one after
        another, and a crash can leave one longer than the rest (until `wattlab repair`);
        reading past the shortest raised "selection + offset not within extent".
        """
        return self.memo("rows", lambda: min(int(self._ds[name].id.shape[0])
                                             for name in schema.STREAM_DATASETS))

    @property
    def remote_host(self) -> str:
        """The agent that sent this stream ("" for the recorder's own host)."""
        return str(self.descriptor.get("remote_host")
                   or self._group.attrs.get(schema.REMOTE_HOST, ""))

    def __repr__(self) -> str:
        return f"<SourceView {self.source_id} {self.kind} {len(self)} rows {self.channel_names}>"

    def refresh(self) -> None:
        """See rows appended since the file was opened (SWMR readers)."""
        for name in schema.STREAM_DATASETS:
            self._ds[name].refresh()
        self._memo.clear()

    def channel_index(self, name: str) -> int:
        if name not in self.channel_names:
            raise RunFileError(
                f"source {self.source_id!r} has no channel {name!r}; it has {self.channel_names}"
            )
        return self.channel_names.index(name)

    def unit(self, name: str) -> str:
        return self.units[self.channel_index(name)]

    def head_ns(self) -> npt.NDArray[np.int64]:
        """Session times of the first rows (up to ``HEAD_ROWS``): spacing and first time."""
        return self.memo("head_ns", lambda: self.time_slice(0, HEAD_ROWS))

    def first_last_ns(self) -> tuple[np.int64, np.int64]:
        """Session times of the first and the last row (the stream must have rows)."""
        def compute() -> tuple[np.int64, np.int64]:
            head, n = self.head_ns(), len(self)  # a short stream's head is all of it
            return head[0], head[-1] if head.size == n else self.time_slice(n - 1, n)[0]

        return self.memo("first_last_ns", compute)

    def time_slice(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """Session times of rows ``start:stop`` (negative indices count from the end)."""
        start, stop, _ = slice(start, stop).indices(len(self))
        out = np.empty(max(0, stop - start), dtype=np.int64)
        if out.size:
            read_rows(self._ds[schema.TIME], start, out)
        return out

    @property
    def time_ns(self) -> npt.NDArray[np.int64]:
        return np.asarray(self._ds[schema.TIME][:len(self)], dtype=np.int64)

    @property
    def time_s(self) -> npt.NDArray[np.float64]:
        return self.time_ns / 1e9

    @property
    def time_raw(self) -> npt.NDArray[Any]:
        return np.asarray(self._ds[schema.TIME_RAW][:len(self)])

    @property
    def values(self) -> npt.NDArray[Any]:
        return np.asarray(self._ds[schema.VALUES][:len(self)])

    @property
    def flags(self) -> npt.NDArray[np.uint8]:
        return np.asarray(self._ds[schema.FLAGS][:len(self)], dtype=np.uint8)

    def channel(self, name: str) -> npt.NDArray[Any]:
        return self.column_slice(name, 0, len(self))

    def column_slice(self, name: str, start: int, stop: int) -> npt.NDArray[Any]:
        """One channel of rows ``start:stop``, read as whole rows a slice at a time.

        Why whole rows: the run is read without HDF5's chunk cache (``Run``), and a column
        selection would then be read from the file value by value.
        """
        col = self.channel_index(name)
        values_ds = self._ds[schema.VALUES]
        start, stop, _ = slice(start, stop).indices(len(self))
        out = np.empty(max(0, stop - start), dtype=self.values_dtype)
        rows = np.empty((min(max(1, out.size), COLUMN_READ_BYTES // max(1, self.row_bytes) or 1),
                         len(self.channel_names)), dtype=self.values_dtype)
        for a in range(start, stop, len(rows)):
            m = min(stop - a, len(rows))
            read_rows(values_ds, a, rows[:m])
            out[a - start:a - start + m] = rows[:m, col]
        return out

    def iter_chunks(
        self, channel: str, rows: int = 1 << 20
    ) -> Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[Any]]]:
        """Yield (time_ns, values) slices of one channel, ``rows`` at a time."""
        self.channel_index(channel)
        n = len(self)
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            yield self.time_slice(start, stop), self.column_slice(channel, start, stop)

    def iter_rows(
        self, rows: int = 1 << 20, *, prefetch: bool = False, overlap: bool = False
    ) -> Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[Any]]]:
        """Yield (time_ns, values n × channels) slices with every channel, in one pass.

        Why: one read of the values dataset serves all its channels, and the slices are read
        into reused buffers (no fresh allocation per slice), so each yielded pair is only
        valid until the next one is yielded: copy what must outlive it. ``prefetch``: a
        background thread reads the next slice into a second pair of buffers while the
        caller works on this one (h5py reads without holding the GIL), so reading and the
        caller's work overlap where a second core is free. ``overlap``: every slice after the
        first starts with the row the one before ended with (one extra row read), so the
        caller sees each pair of consecutive rows inside one slice.
        """
        time_ds, values_ds = self._ds[schema.TIME], self._ds[schema.VALUES]
        n = len(self)
        extra = int(overlap)
        size = min(rows + extra, n)
        buffers = [(np.empty(size, dtype=np.int64),
                     np.empty((size, len(self.channel_names)), dtype=self.values_dtype))
                    for _ in range(2 if prefetch else 1)]

        def read(start: int, k: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]]:
            stop = min(n, start + rows)
            start = max(0, start - extra)
            m = stop - start
            t_buf, v_buf = buffers[k % len(buffers)]
            read_rows(time_ds, start, t_buf[:m])
            read_rows(values_ds, start, v_buf[:m])
            return t_buf[:m], v_buf[:m]

        if not prefetch:
            for k, start in enumerate(range(0, n, rows)):
                yield read(start, k)
            return
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(read, 0, 0)
            for k, start in enumerate(range(0, n, rows)):
                ready = pending.result()
                if start + rows < n:  # into the buffers the caller has just finished with
                    pending = pool.submit(read, start + rows, k + 1)
                yield ready

    def to_pandas(self) -> Any:
        """A DataFrame indexed by session time in seconds, one column per channel + flags."""
        pd = frames_module("pandas", "SourceView.to_pandas()")

        frame = pd.DataFrame(self.values, columns=self.channel_names)
        frame.insert(0, schema.TIME_RAW, self.time_raw)
        frame[schema.FLAGS] = self.flags
        frame.index = pd.Index(self.time_s, name="time_s")
        return frame

    def to_xarray(self) -> Any:
        """An xarray Dataset: one variable per channel (with its unit) on a ``time_s`` axis."""
        xr = frames_module("xarray", "SourceView.to_xarray()")

        values, time_s = self.values, self.time_s
        data_vars = {
            name: ("time_s", values[:, i], {"units": unit})
            for i, (name, unit) in enumerate(zip(self.channel_names, self.units, strict=True))
        }
        data_vars[schema.TIME_RAW] = ("time_s", self.time_raw, {"meaning": self.descriptor.get(
            "time_raw", "")})
        data_vars[schema.FLAGS] = ("time_s", self.flags, {})
        return xr.Dataset(data_vars, coords={"time_s": time_s},
                          attrs={"source_id": self.source_id, "kind": self.kind,
                                 "model": self.model})


class Run:
    """A wattlab run file; use as a context manager or call ``close()``."""

    def __init__(self, path: str) -> None:
        self.path = path
        if not os.path.exists(path):
            raise RunFileError(f"{path}: no such file")
        check_not_truncated(path)
        self._file = open_read_only(path, chunk_cache=False)  # read in slices of whole rows
        if (schema.SOURCES not in self._file
                or schema.FORMAT_VERSION_ATTR not in self._file.attrs):
            self._file.close()
            raise RunFileError(f"{path}: not a wattlab run file (no /sources or format_version)")
        try:
            layout = check_layout(path, self._file)
        except RunFileError:
            self._file.close()
            raise
        self.sources: dict[str, SourceView] = {
            sid: SourceView(sid, source.group, source) for sid, source in layout.sources.items()
        }
        self._table_datasets = layout.tables  # kept open: each lookup decodes its row type
        self._tables: dict[str, Any] = {}  # markers and gaps, read once until ``refresh``

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def __repr__(self) -> str:
        return f"<Run {self.path} sources={list(self.sources)}>"

    @property
    def attrs(self) -> dict[str, Any]:
        return {k: (_text(v) if isinstance(v, bytes) else v) for k, v in self._file.attrs.items()}

    def refresh(self) -> None:
        """Pick up data a live recorder appended (new sources need a reopen)."""
        for view in self.sources.values():
            view.refresh()
        for table in self._table_datasets.values():
            table.refresh()
        self._tables.clear()

    def source(self, source_id: str) -> SourceView:
        if source_id not in self.sources:
            raise RunFileError(f"{self.path}: no source {source_id!r}; it has {list(self.sources)}")
        return self.sources[source_id]

    @property
    def markers(self) -> list[MarkerRow]:
        if schema.MARKERS not in self._tables:
            self._tables[schema.MARKERS] = marker_rows(
                read_head(self._table_datasets[schema.MARKERS]))
        return list(self._tables[schema.MARKERS])

    @property
    def gaps(self) -> list[GapRow]:
        if schema.GAPS not in self._tables:
            self._tables[schema.GAPS] = self._read_gaps()
        return list(self._tables[schema.GAPS])

    def _read_gaps(self) -> list[GapRow]:
        def known(t: int) -> int | None:
            return None if t == schema.UNKNOWN_TIME_NS else t

        return [
            GapRow(_text(r[schema.SOURCE]), int(r[schema.SEQ_FIRST]), int(r[schema.SEQ_LAST]),
                   known(int(r[schema.TIME_FIRST])), known(int(r[schema.TIME_LAST])),
                   int(r[schema.SAMPLES_LOST]), _text(r[schema.REASON]))
            for r in read_head(self._table_datasets[schema.GAPS])
        ]

    def to_pandas(self) -> dict[str, Any]:
        """One DataFrame per source (streams have different rates, so no common index)."""
        return {sid: view.to_pandas() for sid, view in self.sources.items()}

    def to_xarray(self) -> dict[str, Any]:
        """One xarray Dataset per source, each on its own time axis."""
        return {sid: view.to_xarray() for sid, view in self.sources.items()}


@dataclass(frozen=True)
class NewMarkers:
    """Markers a run holds from some row on, and the session start they count from."""

    session_start_ns: int  # host monotonic ns of session time 0
    rows: list[MarkerRow]


def markers_from(path: str, first_row: int) -> NewMarkers | None:
    """``/markers`` from row ``first_row`` on, also while the run is recorded (None: no table yet).

    Why not ``Run``: it checks every stream before anything is read, and a tuner following
    a live run's step markers asks once a second for the few rows added since it last did.
    """
    try:
        f = open_read_only(path)
    except RunFileError:
        return None  # not created yet
    with f:
        table = f.get(schema.MARKERS)
        if table is None:
            return None
        out = np.empty(max(0, int(table.id.shape[0]) - first_row), dtype=table.id.dtype)
        if out.size:
            read_rows(table, first_row, out)
        return NewMarkers(int(f.attrs.get(schema.SESSION_START_MONOTONIC_NS, 0)),
                          marker_rows(out))
