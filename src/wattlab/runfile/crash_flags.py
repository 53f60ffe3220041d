"""Clear the superblock's file consistency flags a killed writer left (``h5clear -s``).

Why this exists: a process that dies while it has an HDF5 file open for writing leaves the
superblock's *file consistency flags* set (bit 0: open for write, bit 2: open for SWMR
write). HDF5 then refuses every plain open ("file is already open for write ... h5clear"),
so h5py, pandas, HDFView and h5dump cannot read the run; readers in SWMR mode still can,
but only while bit 2 is set. SWMR writing keeps the on-disk metadata consistent at every
moment, so after clearing the flags the file can be read and appended to.

Why rewrite the bytes ourselves: HDF5 clears the flags only through a private file-access
property that its ``h5clear`` tool sets; neither HDF5's public API nor h5py (high- or
low-level ``h5f``/``h5p``) exposes it, opening the file for writing is exactly what the
flags forbid, and ``h5clear`` is often not installed. The version 2/3 superblock
(``libver`` ≥ v1.10, what run files use) has a fixed layout: the flags are byte 11 and the
block ends in a Jenkins lookup3 checksum of everything before it (HDF5 file format
specification, "Superblock Version 2/3"), so rewriting that one byte and the checksum is
exact: the flags come out byte for byte as ``h5clear -s`` clears them. The end-of-allocation
address is also raised to the physical file size, so that HDF5 neither reads nor allocates
short of blocks the dead writer had already used after its last superblock write.
"""

from __future__ import annotations

import os

from wattlab.errors import RunFileError

SIGNATURE = b"\x89HDF\r\n\x1a\n"
_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 ``hashlittle`` (HDF5's metadata checksum)."""
    length = len(data)
    a = b = c = (0xDEADBEEF + length + initval) & _MASK
    i = 0
    while length > 12:
        a = (a + int.from_bytes(data[i:i + 4], "little")) & _MASK
        b = (b + int.from_bytes(data[i + 4:i + 8], "little")) & _MASK
        c = (c + int.from_bytes(data[i + 8:i + 12], "little")) & _MASK
        a = (a - c) & _MASK ^ _rot(c, 4)
        c = (c + b) & _MASK
        b = (b - a) & _MASK ^ _rot(a, 6)
        a = (a + c) & _MASK
        c = (c - b) & _MASK ^ _rot(b, 8)
        b = (b + a) & _MASK
        a = (a - c) & _MASK ^ _rot(c, 16)
        c = (c + b) & _MASK
        b = (b - a) & _MASK ^ _rot(a, 19)
        a = (a + c) & _MASK
        c = (c - b) & _MASK ^ _rot(b, 4)
        b = (b + a) & _MASK
        length -= 12
        i += 12
    if length == 0:
        return c
    tail = data[i:i + length] + bytes(12 - length)
    a = (a + int.from_bytes(tail[0:4], "little")) & _MASK
    b = (b + int.from_bytes(tail[4:8], "little")) & _MASK
    c = (c + int.from_bytes(tail[8:12], "little")) & _MASK
    c = (c ^ b) - _rot(b, 14) & _MASK
    a = (a ^ c) - _rot(c, 11) & _MASK
    b = (b ^ a) - _rot(a, 25) & _MASK
    c = (c ^ b) - _rot(b, 16) & _MASK
    a = (a ^ c) - _rot(c, 4) & _MASK
    b = (b ^ a) - _rot(a, 14) & _MASK
    c = (c ^ b) - _rot(b, 24) & _MASK
    return c


def crash_flags(path: str) -> int:
    """The superblock's consistency flags (0: closed cleanly; bit 0 write, bit 2 SWMR).

    A version 0 or 1 superblock (h5py's default format, not a run file's) holds no such
    marks: HDF5 refuses no reader over them, so there is nothing to clear.
    """
    if _superblock_version(path) < 2:
        return 0
    block = _read_superblock(path)
    return block[11]


def _superblock_version(path: str) -> int:
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError as e:
        raise RunFileError(f"{path}: cannot read: {e}") from e
    if len(head) < 9 or head[:8] != SIGNATURE:
        raise RunFileError(f"{path}: not an HDF5 file (no signature at byte 0)")
    return head[8]


def _read_superblock(path: str) -> bytearray:
    try:
        with open(path, "rb") as f:
            head = bytearray(f.read(12))
            if len(head) < 12 or head[:8] != SIGNATURE:
                raise RunFileError(f"{path}: not an HDF5 file (no signature at byte 0)")
            version, offsets = head[8], head[9]
            if version not in (2, 3):
                raise RunFileError(f"{path}: superblock version {version} at byte 8; only "
                                   "versions 2 and 3 (libver >= v1.10) can be repaired")
            if offsets not in (4, 8):
                raise RunFileError(f"{path}: size of offsets {offsets} at byte 9 is not 4 or 8")
            rest = f.read(4 * offsets + 4)
    except OSError as e:
        raise RunFileError(f"{path}: cannot read: {e}") from e
    block = head + rest
    if len(block) != 12 + 4 * offsets + 4:
        raise RunFileError(f"{path}: truncated superblock ({len(block)} bytes)")
    stored = int.from_bytes(block[-4:], "little")
    if lookup3(bytes(block[:-4])) != stored:
        raise RunFileError(f"{path}: superblock checksum mismatch at byte {len(block) - 4}")
    return block


def _cleared(block: bytearray, size: int) -> bytearray:
    """The superblock with no flags, the EOA at least ``size``, and its checksum redone."""
    offsets = block[9]
    eoa_at = 12 + 2 * offsets
    eoa = int.from_bytes(block[eoa_at:eoa_at + offsets], "little")
    out = bytearray(block)
    out[11] = 0
    out[eoa_at:eoa_at + offsets] = max(eoa, size).to_bytes(offsets, "little")
    out[-4:] = lookup3(bytes(out[:-4])).to_bytes(4, "little")
    return out


def cleared_superblock(path: str) -> bytes | None:
    """What the superblock would be after :func:`clear_crash_flags` (None: flags are clear).

    Readers use it to see a crash-left file as a closed one without changing the file.
    """
    if crash_flags(path) == 0:
        return None
    block = _read_superblock(path)
    return bytes(_cleared(block, os.path.getsize(path)))


def clear_crash_flags(path: str) -> bool:
    """Clear the flags a dead writer left and raise the EOA to the file size.

    Returns False (and changes nothing) when the file was closed cleanly.
    """
    block = cleared_superblock(path)
    if block is None:
        return False
    try:
        with open(path, "r+b") as f:
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise RunFileError(f"{path}: cannot rewrite the superblock: {e}") from e
    return True


def fit_eoa_to_file(path: str) -> bool:
    """Lower a superblock's end of allocation that lies past the end of the file.

    Why: under ``ulimit -f`` the writer's last flush can store an end of allocation the
    file could not grow to (the extension failed with EFBIG); HDF5 then refuses the file
    as truncated. The space past the end holds nothing the flushed metadata points to
    (SWMR writes a block before anything that refers to it), so the end of allocation
    may come down to the file's size. Returns whether it changed anything.
    """
    block = _read_superblock(path)
    offsets = block[9]
    eoa_at = 12 + 2 * offsets
    size = os.path.getsize(path)
    if int.from_bytes(block[eoa_at:eoa_at + offsets], "little") <= size:
        return False
    block[eoa_at:eoa_at + offsets] = size.to_bytes(offsets, "little")
    block[-4:] = lookup3(bytes(block[:-4])).to_bytes(4, "little")
    with open(path, "r+b") as f:
        f.write(block)
    return True
