"""Checks for the keys of a bench file's ``[[device]]`` tables, shared by every meter kind.

Each check returns what is wrong with a value (to follow "key ..."), or None; the bench
file parser adds the file, line and key. Meter registrations reuse them for their options.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from wattlab.samples import SOURCE_ID_PATTERN

Check = Callable[[Any], str | None]  # returns what is wrong, or None


def string(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "must be a non-empty string"


def bool_check(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def positive_number(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return None if ok else "must be a number > 0"


def non_negative_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else "must be a whole number >= 0"


def positive_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return None if ok else "must be a whole number >= 1"


def int_range(low: int, high: int) -> Check:
    """A whole number in ``low..high``."""

    def check(value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        return None if ok else f"must be a whole number from {low} to {high}"

    return check


def string_list(value: Any) -> str | None:
    ok = isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)
    return None if ok else "must be a non-empty list of strings"


def source_id(value: Any) -> str | None:
    if isinstance(value, str) and SOURCE_ID_PATTERN.match(value):
        return None
    return "must be 1-64 letters, digits, '_', '.', '-' (it names the stream in the run file)"


_RAIL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
RAIL_NAME_RULE = "1-32 lower-case letters, digits and '_', starting with a letter"


def rail_name(value: Any) -> str | None:
    if not isinstance(value, str) or not _RAIL_NAME.match(value):
        return f"must be a rail name: {RAIL_NAME_RULE} (it starts the channel names)"
    if value == "board":
        return "must not be 'board' (board_power_w is the sum of the rails)"
    return None


def rail_table(inputs: list[str], what: str) -> Check:
    """A check for ``{ input = "rail_name" }`` where input is one of the device's inputs."""

    def check(value: Any) -> str | None:
        example = f'{{ {inputs[0]} = "slot_12v" }}'
        if not isinstance(value, dict) or not value:
            return f"must be a table of {what} = rail name, e.g. {example}"
        for key, name in value.items():
            if key not in inputs:
                return f"names {what} {key!r}, which does not exist ({what}s: " \
                       f"{', '.join(inputs)})"
            problem = rail_name(name)
            if problem:
                return f"{key} = {name!r}: {problem}"
        names = list(value.values())
        twice = sorted({n for n in names if names.count(n) > 1})
        return f"uses the rail name(s) {twice} twice" if twice else None

    return check
