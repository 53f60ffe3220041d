"""The verdict on one energy figure: named checks, each passed or failed with its reason.

Why fixed names: a user filters on them (``jq '.rows[] | select(.valid | not)'``), a
dashboard counts them, and docs/validity.md defines each; a name never changes meaning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

CHECKS = ("coverage", "time", "identity", "counter_vs_integral", "no_silent_zero", "window")
"""Every check, in the order a report lists them (docs/validity.md)."""


@dataclass(frozen=True)
class Check:
    """One check's outcome; ``applies`` is False where it has nothing to look at (it passes)."""

    ok: bool
    reason: str
    applies: bool = True

    @cached_property
    def json(self) -> dict[str, Any]:
        """As JSON; made once: the checks a run's figures share (a pass) are one object."""
        return {"ok": self.ok, "applies": self.applies, "reason": self.reason}


def passed(reason: str) -> Check:
    return Check(True, reason)


def failed(reason: str) -> Check:
    return Check(False, reason)


def not_applicable(reason: str) -> Check:
    return Check(True, reason, applies=False)


def checks_json(checks: Mapping[str, Check]) -> dict[str, dict[str, Any]]:
    """Every named check, in ``CHECKS`` order (each must have been judged)."""
    missing = [name for name in CHECKS if name not in checks]
    if missing:
        raise ValueError(f"validity: checks not judged: {', '.join(missing)}")
    return {name: checks[name].json for name in CHECKS}


def invalid_reasons(figure: Mapping[str, Any]) -> list[str]:
    """'name: reason' per failed check of a figure's JSON, then its invalid parts, if any."""
    out = [f"{name}: {c['reason']}" for name, c in figure["checks"].items() if not c["ok"]]
    if figure.get("invalid_parts"):
        parts = figure["invalid_parts"]
        out.append(f"sums {len(parts)} invalid figure(s): {', '.join(parts[:5])}"
                   + (" ..." if len(parts) > 5 else ""))
    return out



def combined_checks(by_stream: Mapping[str, Mapping[str, Mapping[str, Any]]]
                    ) -> dict[str, dict[str, Any]]:
    """One figure's checks from the checks of the streams it compares (``name: checks``).

    Why: a calibration's figure (a fitted gain, a phase's error) is only as good as both
    streams over its window; each check passes where every stream's does, applies where any
    stream's does, and gives the failing streams' reasons (else every stream's), named.
    """
    out: dict[str, dict[str, Any]] = {}
    for name in CHECKS:
        each = {stream: checks[name] for stream, checks in by_stream.items()}
        ok = all(c["ok"] for c in each.values())
        said = {s: c for s, c in each.items() if not c["ok"]} if not ok else each
        out[name] = {"ok": ok, "applies": any(c["applies"] for c in each.values()),
                     "reason": "; ".join(f"{s}: {c['reason']}" for s, c in said.items())}
    return out
