#!/usr/bin/env python3
"""Copy a finished run file with chunks sized to its data and gzip, for tests/data.

    python bench/compact_run.py IN.h5 OUT.h5

Why: the recorder's chunks are sized for long recordings (65 536 rows), so a 30 s trace
takes ~8 MB on disk; the same rows, attributes and layout fit in a few hundred kB.
"""

from __future__ import annotations

import sys

import h5py


def copy_attrs(src: h5py.HLObject, dst: h5py.HLObject) -> None:
    for key, value in src.attrs.items():
        dst.attrs[key] = value


def compact(src_path: str, dst_path: str) -> None:
    with h5py.File(src_path, "r") as src, h5py.File(dst_path, "w") as dst:
        copy_attrs(src, dst)

        def visit(name: str, obj: h5py.HLObject) -> None:
            if isinstance(obj, h5py.Group):
                copy_attrs(obj, dst.require_group(name))
                return
            rows = max(1, min(obj.shape[0] if obj.shape else 1, 4096))
            chunks = (rows, *obj.shape[1:]) if obj.shape else None
            growable = (None, *obj.shape[1:]) if obj.shape else None
            out = dst.create_dataset(name, data=obj[()], chunks=chunks, maxshape=growable,
                                     compression="gzip" if obj.shape else None,
                                     shuffle=bool(obj.shape))
            copy_attrs(obj, out)

        src.visititems(visit)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    compact(sys.argv[1], sys.argv[2])
