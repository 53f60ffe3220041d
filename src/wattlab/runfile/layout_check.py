"""Is this file a run file we can read? One clear ``RunFileError`` instead of a traceback.

Why before anything is read: a truncated HDF5 file can make the SWMR reader retry its
metadata reads for minutes, and a file of another layout fails deep inside an analysis
with a ``KeyError``. Checking the superblock (file shorter than HDF5's end-of-allocation:
truncated) and the layout up front turns both into one message that names the file and
the problem, which the CLI reports with exit status 2.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from wattlab.errors import RunFileError
from wattlab.runfile import schema
from wattlab.runfile.h5_read import open_read_only, read_attr, read_head

SIGNATURE = b"\x89HDF\r\n\x1a\n"
MAX_CHECKED_MARKERS = 100_000


def check_not_truncated(path: str) -> None:
    """Compare the file's size with the end-of-allocation its superblock (v2/v3) records."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(48)
    except OSError as e:
        raise RunFileError(f"{path}: cannot read: {e}") from e
    if len(head) < 12 or head[:8] != SIGNATURE:
        return  # not HDF5 at byte 0 (or a user block): h5py gives the error
    version, offsets = head[8], head[9]
    if version not in (2, 3) or offsets not in (4, 8) or len(head) < 12 + 4 * offsets:
        return  # older superblocks keep the EOA elsewhere; nothing cheap to check
    eoa_at = 12 + 2 * offsets
    eoa = int.from_bytes(head[eoa_at:eoa_at + offsets], "little")
    if size < eoa:
        raise RunFileError(f"{path}: truncated: the file is {size} bytes but its HDF5 "
                           f"superblock says {eoa} (copy interrupted?)")


def _check_dataset(path: str, where: str, ds: Any, kinds: str, ndim: int) -> None:
    if not isinstance(ds, h5py.Dataset):
        raise RunFileError(f"{path}: {where} is not a dataset")
    dtype, rank = ds.id.dtype, ds.id.rank  # the ID's: h5py's properties cost ~10x as much
    if dtype.kind not in kinds or rank != ndim:
        raise RunFileError(f"{path}: {where} has dtype {dtype} and {rank} dimension(s); "
                           f"a run file has {ndim}-D numbers there")


def _source_dataset(path: str, where: str, group: h5py.Group, name: str) -> h5py.Dataset:
    """A source group's dataset, opened by HDF5's own call.

    Why: h5py's ``group[name]`` costs ~35 us, the call and the wrapper ~18 us, and a run
    file opens four per source. Where it fails, h5py's lookup says why.
    """
    try:
        return h5py.Dataset(h5py.h5d.open(group.id, name.encode()))
    except KeyError as e:
        if name not in group:
            raise RunFileError(f"{path}: {where} has no '{name}' dataset") from None
        if "checksum" in str(e):  # a torn write: the writer died while writing this header
            raise RunFileError(f"{path}: {where}/{name} is damaged (its header fails its "
                               f"checksum: {e}); the rows in it cannot be read") from None
        raise RunFileError(f"{path}: {where}/{name} is not a dataset") from None


@dataclass
class SourceLayout:
    """What checking a source group read: its datasets, descriptor and channel names.

    Why kept: each h5py lookup costs ~0.1 ms, and ``SourceView`` needs the same objects;
    handing them over halves the opening of a run file.
    """

    group: h5py.Group
    datasets: dict[str, h5py.Dataset]
    descriptor: dict[str, Any]
    channel_names: list[Any]


def check_source(path: str, source_id: str, group: Any) -> SourceLayout:
    """One source group has its datasets with the right types, descriptor and names."""
    where = f"/{schema.SOURCES}/{source_id}"
    if not isinstance(group, h5py.Group):
        raise RunFileError(f"{path}: {where} is not a group")
    datasets = {}
    for name, (kinds, ndim) in schema.STREAM_DATASET_KINDS.items():
        ds = _source_dataset(path, where, group, name)
        _check_dataset(path, f"{where}/{name}", ds, kinds, ndim)
        datasets[name] = ds
    values = datasets[schema.VALUES]
    try:
        descriptor = json.loads(read_attr(group, schema.DESCRIPTOR_JSON))
        names = list(read_attr(values, schema.CHANNEL_NAMES))
    except (KeyError, ValueError, TypeError) as e:
        raise RunFileError(f"{path}: {where}: descriptor or channel names unreadable "
                           f"({e})") from e
    if len(names) != values.shape[1]:
        raise RunFileError(f"{path}: {where}/{schema.VALUES} has {values.shape[1]} columns "
                           f"but {len(names)} channel names")
    return SourceLayout(group, datasets, descriptor, names)


@dataclass
class RunLayout:
    """What checking a run file read: each source's layout, the markers and gaps tables.

    Why the tables too: a reader that opens them again pays the lookup and the decoding of
    their row type (~0.1 ms each) a second time.
    """

    sources: dict[str, SourceLayout]
    tables: dict[str, h5py.Dataset]


def check_layout(path: str, f: h5py.File) -> RunLayout:
    """Every source has its datasets with the right types; markers and gaps are tables."""
    tables = {}
    for name, fields in ((schema.MARKERS, schema.MARKER_FIELDS), (schema.GAPS, schema.GAP_FIELDS)):
        table = tables[name] = f.get(name)
        if not isinstance(table, h5py.Dataset) or table.dtype.names is None or not set(
                fields) <= set(table.dtype.names):
            raise RunFileError(f"{path}: /{name} is missing or not a table of {fields}")
    sources = f.get(schema.SOURCES)
    if not isinstance(sources, h5py.Group):
        raise RunFileError(f"{path}: /{schema.SOURCES} is not a group")
    try:
        layouts = {sid: check_source(path, sid, group) for sid, group in sources.items()}
    except RuntimeError as e:  # HDF5's link iteration: the index itself is damaged
        raise RunFileError(f"{path}: /{schema.SOURCES} cannot be listed ({e}): a crash cut "
                           "its index of streams while one was being added") from e
    # whole rows: cheaper than h5py's field selection, and the other fields are small
    payloads = read_head(tables[schema.MARKERS], MAX_CHECKED_MARKERS)[schema.PAYLOAD]
    for i, raw in enumerate(np.asarray(payloads)):
        try:
            json.loads(raw.decode() if isinstance(raw, bytes) else str(raw) or "{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise RunFileError(f"{path}: /{schema.MARKERS} row {i}: {schema.PAYLOAD} is not "
                               f"JSON ({e})") from e
    return RunLayout(layouts, tables)


def check_run_file(path: str, f: h5py.File | None = None) -> None:
    """Both checks; ``f`` is the already open file (else it is opened here, read-only)."""
    check_not_truncated(path)
    if f is not None:
        check_layout(path, f)
        return
    with open_read_only(path) as opened:
        check_layout(path, opened)
