"""What a power stream measures, so a target is only scored against a reference of the same.

Why: a wall meter sees the whole node; a riser sees one GPU's board. Their disagreement is
the rest of the node, not a meter error, and a qualification that scored it would fail a
good meter or pass a bad one. The run says what each stream measures where a bench file
wired it (``gpu = N`` and rails: ``config["feeds_gpu"]``, ``config["rails"]``); a GPU's own
reading measures its board (or the module ``config``'s scope names). Without that wiring
the user says it: ``--measures SRC=WHAT``.
"""

from __future__ import annotations

from collections.abc import Mapping

from wattlab.analysis.alignment import parse_spec, power_channel, resolve
from wattlab.analysis.energy import energy_channel
from wattlab.errors import UsageError
from wattlab.runfile import Run, SourceView

GPU_KINDS = ("nvml", "amdsmi")


def _gpu_index(source_id: str) -> str | None:
    """``gpu0.power`` or ``gpu0`` → ``0`` (the NVML acquirer's stream ids), else None."""
    head = source_id.split(".", 1)[0]
    digits = head[3:]
    return digits if head.startswith("gpu") and digits.isdigit() else None


def measures(view: SourceView, channel: str, told: Mapping[str, str]) -> str | None:
    """What ``SRC:CHANNEL`` measures (``gpu 0 board``, ``rail wall``…), None if unknown."""
    if view.source_id in told:
        return told[view.source_id]
    config = view.descriptor.get("config", {})
    if view.kind in GPU_KINDS and (index := _gpu_index(view.source_id)) is not None:
        scope = config.get("scope", {})
        return f"gpu {index} {'module' if scope.get('module') else 'board'}"
    if "feeds_gpu" in config and channel == config.get("board_power_channel"):
        return f"gpu {config['feeds_gpu']} board"
    for rail, wiring in config.get("rails", {}).items():
        if channel in wiring.get("channels", []):
            return f"rail {rail}"
    return None


def refusal(ref: tuple[SourceView, str], target: tuple[SourceView, str],
            told: Mapping[str, str]) -> str | None:
    """Why ``target`` cannot be qualified against ``ref`` (None: it can)."""
    (rv, rc), (tv, tc) = ref, target
    if (rv.source_id, rc) == (tv.source_id, tc):
        return "it is the reference itself"
    what_ref, what_target = measures(rv, rc, told), measures(tv, tc, told)
    for view, what in ((rv, what_ref), (tv, what_target)):
        if what is None:
            return (f"the run does not say what {view.source_id} measures (no bench-file "
                    f"wiring): say it with --measures {view.source_id}=WHAT")
    if what_ref != what_target:
        return (f"it measures {what_target}, the reference {rv.source_id}:{rc} measures "
                f"{what_ref}: their difference is not a meter error")
    return None


def parse_measures(items: list[str]) -> dict[str, str]:
    """``--measures SRC=WHAT`` options into {source: what}; WHAT as ``gpu 0 board`` or a rail."""
    out: dict[str, str] = {}
    for item in items:
        source, sep, what = item.partition("=")
        if not sep or not source or not what.strip():
            raise UsageError(f"--measures {item!r}: expected SRC=WHAT (e.g. ps3=gpu0, "
                             "wall=wall)")
        what = what.strip()
        index = _gpu_index(what)
        out[source] = f"gpu {index} board" if index is not None else f"rail {what}"
    return out


COUNTER_AGREEMENT = ("agreement with the GPU's own energy counter, not accuracy: the counter "
                     "is no meter of a stated class, and what it shares with the GPU's power "
                     "readings (the same sensor) no comparison against it can show")


def reference_stream(run: Run, spec: str) -> tuple[SourceView, str]:
    """The reference ``SRC[:CH]`` names: its power channel, else (a counter) its J channel."""
    source_id, channel = parse_spec(spec)
    if channel is None and power_channel(view := run.source(source_id)) is None:
        channel = energy_channel(view)
        if channel is not None:
            return view, channel
    return resolve(run, spec)


def reference_meaning(view: SourceView, channel: str) -> str | None:
    """What a score against this reference means where it is not accuracy (None: it is).

    Why: on a machine with no meter the GPU's energy counter is the best reference at hand,
    and a figure scored against it must never read as a meter's qualification.
    """
    if view.kind in GPU_KINDS and view.unit(channel) == "J":
        return COUNTER_AGREEMENT
    return None
