"""The checks one stream answers for a window on its own: coverage, time, identity.

Why apart from the counter's cross-check: these read only the stream's times
(``time_scan``) and descriptor, so they hold for any stream, any meter, any file.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wattlab.analysis.energy.validity.time_scan import HOLE_SPACINGS, TimeScan
from wattlab.analysis.energy.validity.verdict import Check, failed, not_applicable, passed
from wattlab.runfile import SourceView

EDGE_TOLERANCE_S = 1e-9  # a window edge on the first or last row is inside it
BRACKETED = passed("the counter's reads bracket the window")
COVERED = passed(f"rows throughout, none further apart than {HOLE_SPACINGS:g} spacings")
ORDERED = passed("times never go backwards in the window")


def coverage(scan: TimeScan, t0_s: float, t1_s: float, method: str,
             uncovered_s: float) -> Check:
    """The window lies between the stream's first and last row, with no hole inside.

    A counter covers a window its reads bracket (it kept counting between them); a power
    stream must also have no segment longer than ``HOLE_SPACINGS`` nominal spacings in the
    window and nothing the integral left uncovered (a non-finite value, a recorded gap).
    """
    before = scan.first_s - t0_s
    after = t1_s - scan.last_s
    problems = []
    if before > EDGE_TOLERANCE_S:
        problems.append(f"starts {before:.3f} s before the stream's first row "
                        f"({scan.first_s:.3f} s)")
    if after > EDGE_TOLERANCE_S:
        problems.append(f"ends {after:.3f} s after the stream's last row ({scan.last_s:.3f} s)")
    if method == "counter":
        if problems:
            return failed("the counter's reads do not bracket the window: it "
                          + "; it ".join(problems))
        return BRACKETED
    holes = scan.holes_in(t0_s, t1_s)
    if holes.size:
        longest = float((holes[:, 1] - holes[:, 0]).max())
        problems.append(f"has {len(holes)} hole(s) longer than {HOLE_SPACINGS:g} spacings of "
                        f"{scan.spacing_s * 1e3:.3g} ms, the longest {longest * 1e3:.3g} ms "
                        f"from {float(holes[0, 0]):.3f} s")
    in_holes_s = float(np.sum(np.minimum(holes[:, 1], t1_s) - np.maximum(holes[:, 0], t0_s))) \
        if holes.size else 0.0
    unexplained_s = uncovered_s - max(0.0, before) - max(0.0, after) - in_holes_s
    if unexplained_s > 1e-6:
        problems.append(f"{unexplained_s:.3f} s more the integral could not cover "
                        "(a non-finite value or a gap the recorder wrote)")
    if problems:
        return failed("the window " + "; ".join(problems))
    return COVERED


def time_order(scan: TimeScan, t0_s: float, t1_s: float, integrated: bool) -> Check:
    """No time going backwards in the window (read from the times, so on every file).

    ``integrated``: whether the stream gave a figure; one whose time goes backwards
    anywhere is not integrated (``alignment`` refuses it), which this says too.
    """
    steps = scan.backwards_in(t0_s, t1_s)
    if steps.size:
        a, b = float(steps[0, 0]), float(steps[0, 1])
        return failed(f"time goes backwards {len(steps)} time(s) in the window, first from "
                      f"{a:.6f} s to {b:.6f} s")
    if scan.backwards_s.size and not integrated:
        a = float(scan.backwards_s[0, 0])
        return failed(f"time goes backwards at {a:.6f} s (outside this window): the stream "
                      "was not integrated at all")
    return ORDERED


def device_identity(view: SourceView) -> str:
    """The device a stream names: its GPU UUID, else its serial ("" where neither)."""
    return str(view.descriptor.get("config", {}).get("uuid") or view.descriptor.get("serial")
               or "")


def device_name(view: SourceView) -> tuple[str, str]:
    """(host, device): a device's streams share the source id before its first dot.

    After an agent's prefix: ``node1.gpu0.samples`` is node1's ``gpu0``.
    """
    host = view.remote_host
    local = view.source_id.removeprefix(f"{host}.") if host else view.source_id
    return host, local.split(".", 1)[0]


def identities(views: Sequence[SourceView]) -> dict[str, Check]:
    """Per stream: one device identity, the same as every stream of its device name has."""
    named: dict[tuple[str, str], dict[str, list[str]]] = {}
    for view in views:
        named.setdefault(device_name(view), {}).setdefault(
            device_identity(view), []).append(view.source_id)
    out: dict[str, Check] = {}
    for view in views:
        mine = device_identity(view)
        seen = {k: v for k, v in named[device_name(view)].items() if k}
        if len(seen) > 1:
            out[view.source_id] = failed(
                f"the streams of {device_name(view)[1]} name {len(seen)} devices: "
                + "; ".join(f"{k} ({', '.join(v)})" for k, v in sorted(seen.items())))
        elif mine:
            out[view.source_id] = passed(f"one device: {mine}")
        else:
            out[view.source_id] = not_applicable("the stream records no UUID or serial")
    return out
