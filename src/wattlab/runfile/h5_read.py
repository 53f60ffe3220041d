"""Open an HDF5 file for reading the one way every reader in wattlab does.

Without a file lock, so that no reader (a live view, an analysis of a file still being
recorded) can stop the recorder from reopening the file; and the same way everywhere,
because HDF5 refuses a second handle on a file whose locking flag differs from the first
("file locking flag values don't match") — which is why the writers (runfile/writer.py,
calibration records, sweep files) open without a lock too. A second writer is kept out by
O_EXCL creation instead: only the session's own supervisor ever reopens a run to write.

A file whose writer was killed is read without asking and without being changed: in SWMR
mode where its superblock allows it, else through :class:`ClosedView`, which shows HDF5 the
superblock as ``wattlab repair`` would leave it (``runfile/crash_flags.py`` says why).
"""

from __future__ import annotations

import ctypes
import functools
import io
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from wattlab.errors import RunFileError
from wattlab.runfile.crash_flags import cleared_superblock

# SWMR readers retry a metadata read whose checksum fails, sleeping 1 ns, 2 ns, ... up to an
# hour between tries: HDF5's default of 100 tries turns a torn write of a dead writer into a
# wait of days (the session's salvage hung so in CI). 28 tries wait 0.27 s at most, time
# enough for a live writer to finish the entry being read; then the read fails and the
# reader says so.
SWMR_READ_ATTEMPTS = 28


def _swmr_read(path: str, chunk_cache: bool) -> h5py.File:
    """``h5py.File(path, "r", libver="latest", swmr=True, locking=False)``, tries bounded."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    fapl.set_file_locking(False, True)
    if not chunk_cache:
        mdc, slots, _, w0 = fapl.get_cache()
        fapl.set_cache(mdc, slots, 0, w0)
    set_attempts = _read_attempts_setter()
    if set_attempts is not None:
        set_attempts(fapl.id, SWMR_READ_ATTEMPTS)
    flags = h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ
    return h5py.File(h5py.h5f.open(path.encode(), flags, fapl=fapl))


@functools.cache
def _read_attempts_setter() -> Any:
    """HDF5's ``H5Pset_metadata_read_attempts``, from the library h5py loaded.

    h5py has no wrapper for it. None where that library cannot be found (not Linux): HDF5's
    default then.
    """
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "libhdf5" in line}
    for lib in sorted(paths):
        if "_hl" in Path(lib).name:
            continue
        setter = getattr(ctypes.CDLL(lib), "H5Pset_metadata_read_attempts", None)
        if setter is not None:
            setter.argtypes = [ctypes.c_int64, ctypes.c_uint]
            return setter
    return None


@functools.lru_cache(maxsize=16)
def _memory_space(shape: tuple[int, ...]) -> Any:
    return h5py.h5s.create_simple(shape)


@functools.lru_cache(maxsize=8)
def _memory_type(dtype: np.dtype[Any]) -> Any:
    return h5py.h5t.py_create(dtype)


def read_rows(ds: h5py.Dataset, start: int, out: npt.NDArray[Any]) -> None:
    """Rows ``start:start + len(out)`` of a dataset into ``out`` (C-contiguous, its dtype).

    Why HDF5's own call: h5py's ``read_direct`` builds selection objects on every call,
    which for a small stream costs more than reading it; the buffer's dataspace and type
    are kept for the shapes and dtypes last read (each new HDF5 object costs ~3 us, a
    third of a small read; only a few: closing a file visits every live HDF5 object).
    """
    file_space = ds.id.get_space()
    file_space.select_hyperslab((start,) + (0,) * (out.ndim - 1), out.shape)
    ds.id.read(_memory_space(out.shape), file_space, out, mtype=_memory_type(out.dtype))


def read_head(ds: h5py.Dataset, rows: int | None = None) -> npt.NDArray[Any]:
    """The first ``rows`` rows of a dataset (None: all), as ``ds[:rows]`` has them.

    Why: h5py's slicing costs ~50 us more than the read itself for a table of a few rows.
    """
    shape = ds.id.shape
    n = shape[0] if rows is None else min(rows, shape[0])
    out = np.empty((n, *shape[1:]), dtype=ds.id.dtype)
    if n:
        read_rows(ds, 0, out)
    return out


def read_attr(obj: Any, name: str) -> Any:
    """An attribute of a group or dataset by HDF5's own calls (strings come as bytes).

    Why: h5py's ``attrs[name]`` costs ~1.5x as much, and a run file has three per stream.
    """
    attr = h5py.h5a.open(obj.id, name.encode())
    out = np.empty(attr.shape, dtype=attr.dtype)
    attr.read(out)
    return out[()] if out.ndim == 0 else out


class ClosedView(io.RawIOBase):
    """A read-only file object: the file's bytes, with ``superblock`` over its start.

    Why a file object and not a copy: h5py reads through it (its "fileobj" driver) only
    the parts it needs, so a crash-left recording of any size opens at once, untouched.
    """

    def __init__(self, path: str, superblock: bytes) -> None:
        super().__init__()
        self._file = open(path, "rb")  # noqa: SIM115 - lives as long as the view
        self._head = superblock

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer: Any) -> int:
        start = self._file.tell()
        n = self._file.readinto(buffer)
        if start < len(self._head) and n:
            end = min(n, len(self._head) - start)
            memoryview(buffer).cast("B")[:end] = self._head[start:start + end]
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def open_read_only(path: str, *, swmr: bool = True, chunk_cache: bool = True) -> h5py.File:
    """SWMR read where the file allows it (a live run), else a plain read; no lock.

    ``chunk_cache=False``: no HDF5 chunk cache, for readers that read whole rows in
    slices (``run_file``): through the cache each ~0.5 MB chunk of a stream is copied
    twice, file to cache to slice; without it once. Reading a column without it goes
    element by element: such readers read rows and take the column themselves.
    """
    cache = {} if chunk_cache else {"rdcc_nbytes": 0}
    # HDF5 raises RuntimeError, not OSError, for a superblock it cannot decode
    if swmr:
        try:
            return _swmr_read(path, chunk_cache)
        except (OSError, RuntimeError):
            pass
    error: Exception
    try:
        return h5py.File(path, "r", locking=False, **cache)
    except (OSError, RuntimeError) as e:
        error = e
    try:
        superblock = cleared_superblock(path)
    except RunFileError:
        superblock = None
    if superblock is not None:  # left open for writing without SWMR: read as if closed
        try:
            return h5py.File(ClosedView(path, superblock), "r", locking=False, **cache)
        except (OSError, RuntimeError) as e:
            error = e
    raise RunFileError(f"{path}: not a readable HDF5 file ({error})") from error
