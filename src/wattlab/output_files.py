"""Temporary files for atomic writes (write, then rename) that get the user's umask.

Why not ``tempfile.mkstemp``: it creates its file with mode 0600 whatever the umask, and
the rename keeps that mode, so reports and sweep files came out private to their owner.
Creating the file with mode 0666 lets the kernel apply the umask, as for any other output.
"""

from __future__ import annotations

import os
import secrets


def create_temp(folder: str, prefix: str, suffix: str = "") -> tuple[int, str]:
    """A new, empty file in ``folder`` (descriptor open for writing, path), umask applied."""
    while True:
        path = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path
        except FileExistsError:
            continue
