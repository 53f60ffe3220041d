"""The sharing rule as data: its name, what it says, and its fitted parameters with their ±.

Why data and not code: published per-request and per-process figures disagree because
nobody states how the energy of concurrent work was shared. A report that carries its rule
(and how well the rule's parameters are known) can be checked and compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Param:
    """One fitted (or given) parameter of a rule: value, ± (None: not estimated), unit."""

    value: float
    pm: float | None = None
    unit: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "pm": self.pm, "unit": self.unit}


@dataclass(frozen=True)
class Rule:
    """How each interval's dynamic energy is shared among the activities running in it.

    ``weights``: per kind of work, the (relative) power one activity of that kind draws;
    an activity's share of an interval is its weight times its intensity over the sum of
    those of every activity running then. ``notes``: how the weights were obtained;
    ``caveats``: what the run shows the rule cannot tell (printed as warnings).
    """

    name: str
    description: str
    weights: dict[str, Param]
    notes: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)

    def weight(self, kind: str) -> float:
        """The weight of a kind of work (a kind the rule does not name is an error)."""
        if kind not in self.weights:
            raise KeyError(f"rule {self.name!r} has no weight for work of kind {kind!r}; it "
                           f"has {sorted(self.weights)}")
        return self.weights[kind].value

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "weights": {k: p.to_json() for k, p in self.weights.items()},
                "notes": list(self.notes), "caveats": list(self.caveats)}


def equal_rule(kinds: list[str], why: str = "") -> Rule:
    """Every activity running in an interval gets the same share, whatever its kind."""
    return Rule("equal", "each interval's dynamic energy split equally among the activities "
                "running in it", {k: Param(1.0) for k in kinds}, [why] if why else [])
