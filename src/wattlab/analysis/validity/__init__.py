"""A validity verdict on every energy figure: named checks, each defined in docs/validity.md."""

from wattlab.analysis.validity.judge import judge
from wattlab.analysis.validity.verdict import CHECKS, invalid_reasons
from wattlab.analysis.validity.window_check import clip_window

__all__ = ["CHECKS", "clip_window", "invalid_reasons", "judge"]
