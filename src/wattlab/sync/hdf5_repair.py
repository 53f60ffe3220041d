"""Make a run file whose writer was killed writable again (what ``h5clear -s -i`` does).

Why this exists: a process that dies while it has an HDF5 file open for (SWMR) writing
leaves the superblock's *file consistency flags* set. Readers in SWMR mode still open the
file (``wattlab.open`` does), but HDF5 refuses to open it for writing again until the
flags are cleared, and the HDF5 command-line tools that clear them are often not
installed. SWMR writing keeps the on-disk metadata consistent at every moment, so after
clearing the flags the file can be appended to. The end-of-allocation address is raised
to the physical file size so that new space never lands on blocks the dead writer had
already used after its last flush.

Only superblock versions 2 and 3 (what ``libver="latest"`` writes) are handled; their
layout and the Jenkins lookup3 checksum are in the HDF5 file format specification.
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
    """The superblock's consistency flags (0: closed cleanly; bit 0 write, bit 2 SWMR)."""
    block = _read_superblock(path)
    return block[11]


def _read_superblock(path: str) -> bytearray:
    try:
        with open(path, "rb") as f:
            head = bytearray(f.read(12))
            if len(head) < 12 or head[:8] != SIGNATURE:
                raise RunFileError(f"{path}: not an HDF5 file (no signature at byte 0)")
            version, offsets = head[8], head[9]
            if version not in (2, 3):
                raise RunFileError(f"{path}: superblock version {version} at byte 8; only "
                                   "versions 2 and 3 (libver='latest') can be repaired")
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


def clear_crash_flags(path: str) -> bool:
    """Clear the flags a dead writer left and raise the EOA to the file size.

    Returns False (and changes nothing) when the file was closed cleanly.
    """
    block = _read_superblock(path)
    if block[11] == 0:
        return False
    offsets = block[9]
    eoa_at = 12 + 2 * offsets
    size = os.path.getsize(path)
    eoa = int.from_bytes(block[eoa_at:eoa_at + offsets], "little")
    block[11] = 0
    block[eoa_at:eoa_at + offsets] = max(eoa, size).to_bytes(offsets, "little")
    block[-4:] = lookup3(bytes(block[:-4])).to_bytes(4, "little")
    try:
        with open(path, "r+b") as f:
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise RunFileError(f"{path}: cannot rewrite the superblock: {e}") from e
    return True
