"""A qualification recorded in parts: its levels found across several run files.

Why: MLPerf's full form needs three levels of five 60 s windows (about 15 minutes), and a
lent machine or a batch slot may allow commands of ten minutes at most. `qualify --gpu I
--levels idle` (then load1, then load2) records one level a command; the three run files
are then scored together. Each level must be marked in exactly one of them, and they must
come from the same system: one host, and each scored stream naming the same device.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wattlab.analysis.energy import device_identity
from wattlab.analysis.qualify.levels import LEVELS, Level, marked_phases
from wattlab.errors import UsageError
from wattlab.runfile import Run, SourceView, schema


@dataclass(frozen=True)
class Part:
    """One run file and the levels it holds, in time order."""

    run: Run
    levels: tuple[Level, ...]


def parts_of(runs: Sequence[Run]) -> list[Part]:
    """The runs holding the levels, each level in exactly one, every level somewhere."""
    found: dict[str, str] = {}
    parts = []
    paths = [os.path.realpath(run.path) for run in runs]
    if len(set(paths)) < len(paths):
        twice = next(run.path for run, p in zip(runs, paths, strict=True)
                     if paths.count(p) > 1)
        raise UsageError(f"{twice}: given twice; each part of a qualification is one run")
    for run in runs:
        levels = marked_phases(run.markers, run.path)
        for lv in levels:
            if lv.name in found:
                raise UsageError(f"{run.path}: phase {lv.name!r} is also marked in "
                                 f"{found[lv.name]}; each level is scored from one run")
            found[lv.name] = run.path
        if not levels and len(runs) > 1:
            raise UsageError(f"{run.path}: marks none of the phases {', '.join(LEVELS)}")
        parts.append(Part(run, tuple(levels)))
    missing = [name for name in LEVELS if name not in found]
    if missing:
        raise UsageError(f"{', '.join(r.path for r in runs)}: no "
                         f"{', '.join(repr(m) for m in missing)} phase marked; qualify needs "
                         f"phases {', '.join(LEVELS)} (docs/qualify.md)")
    return parts


def check_same_system(parts: Sequence[Part], stream_of: Callable[[Run], SourceView]) -> None:
    """Refuse parts from different hosts, or whose stream names another device."""
    if len(parts) < 2:
        return
    first = parts[0].run
    host = first.attrs.get(schema.HOST)
    device = device_identity(stream_of(first))
    for part in parts[1:]:
        other = part.run.attrs.get(schema.HOST)
        if other != host:
            raise UsageError(f"{part.run.path}: recorded on host {other!r}, {first.path} on "
                             f"{host!r}; a qualification's levels come from one system")
        view = stream_of(part.run)
        if device_identity(view) != device:
            raise UsageError(f"{part.run.path}: {view.source_id} is device "
                             f"{device_identity(view) or 'unnamed'!r}, in {first.path} "
                             f"{device or 'unnamed'!r}; a qualification's levels come from "
                             "one system")
